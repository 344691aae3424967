"""A small Django app on PostgreSQL for benchmarks/django_pg.py (issue 12): settings in code (app.py)."""

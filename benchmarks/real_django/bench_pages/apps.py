from django.apps import AppConfig


class BenchPagesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "bench_pages"

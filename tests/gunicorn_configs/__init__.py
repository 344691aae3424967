"""Realistic gunicorn config files (Django, Flask, FastAPI deployments, Docker images, PaaS), as
their projects write them, for tests/config/test_gunicorn_configs.py. Paths come from the environment
(LOG_DIR, PORT...) so a test can point them at its own directory."""

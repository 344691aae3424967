"""Django settings for apps.forksafe.django_app: PostgreSQL, persistent connections."""

from apps.forksafe import pg_settings

_pg = pg_settings()

SECRET_KEY = "refork-fork-proof"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "apps.forksafe.django_urls"
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
USE_TZ = True
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3 (psycopg2 when only that is installed)
        "HOST": _pg["host"],
        "PORT": _pg["port"],
        "USER": _pg["user"],
        "PASSWORD": _pg["password"],
        "NAME": _pg["dbname"],
        "CONN_MAX_AGE": 600,  # persistent: each worker keeps its own connection between requests
        "OPTIONS": {"application_name": "refork-proof-django"},
    }
}

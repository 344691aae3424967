"""Settings of the benchmark site: the project `wagtail start` generated (in .site-X.Y, one per
interpreter, made by prepare.py) with production settings (DEBUG off, manifest static files
served by WhiteNoise, SQLite) and the benchmark's page types."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SITE_DIR = HERE / f".site-{sys.version_info[0]}.{sys.version_info[1]}"
sys.path.insert(0, str(SITE_DIR))

from benchsite.settings.base import *  # noqa: E402,F403

DEBUG = False
SECRET_KEY = "benchmark-only-not-a-secret"  # noqa: S105
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["bench_pages", *INSTALLED_APPS]  # noqa: F405
MIDDLEWARE = [
    "bench_pages.middleware.worker_pid",
    MIDDLEWARE[0],  # noqa: F405  (SecurityMiddleware first, as WhiteNoise's docs say)
    "whitenoise.middleware.WhiteNoiseMiddleware",
    *MIDDLEWARE[1:],  # noqa: F405
]
STORAGES["staticfiles"]["BACKEND"] = "whitenoise.storage.CompressedManifestStaticFilesStorage"  # noqa: F405
# The page types' migrations are made per site (per Wagtail version) by prepare.py.
MIGRATION_MODULES = {"bench_pages": "bench_pages_migrations"}
WAGTAILADMIN_BASE_URL = "http://127.0.0.1"
DATABASES["default"]["OPTIONS"] = {"timeout": 30}  # noqa: F405
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
}

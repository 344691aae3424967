"""A Django monolith's WSGI module that reads from the database while it loads."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "apps.forksafe.django_settings")

import django  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.db import connection  # noqa: E402

django.setup()
application = get_wsgi_application()


def load_server_version() -> str:
    with connection.cursor() as cursor:  # connects at import
        cursor.execute("SELECT version()")
        return cursor.fetchone()[0]


SERVER_VERSION = load_server_version()  # connects at import

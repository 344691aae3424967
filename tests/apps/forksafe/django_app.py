"""A Django monolith's WSGI module that reads from the database while it loads."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "apps.forksafe.django_settings")

import django  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.db import connection  # noqa: E402

django.setup()
application = get_wsgi_application()


def current_backend() -> int:
    with connection.cursor() as cursor:  # connects at import
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


IMPORT_BACKEND = current_backend()  # connects at import

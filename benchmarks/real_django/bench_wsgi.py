"""The WSGI entry point every server under test imports: bench_wsgi:application."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench_settings")

application = get_wsgi_application()

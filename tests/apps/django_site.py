"""A small Django site (admin, auth, sessions, templates; an in-memory SQLite database): what a
real framework loads into the mold, for the monitor's memory test."""

import django
from django.conf import settings

settings.configure(
    DEBUG=False,
    SECRET_KEY="not-a-secret",
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=[
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        "django.contrib.staticfiles",
    ],
    MIDDLEWARE=[
        "django.middleware.security.SecurityMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ],
    TEMPLATES=[
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "APP_DIRS": True,
            "OPTIONS": {"context_processors": ["django.contrib.auth.context_processors.auth"]},
        }
    ],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    STATIC_URL="/static/",
    USE_TZ=True,
)
django.setup()

from django.contrib import admin  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import HttpResponse  # noqa: E402
from django.urls import path  # noqa: E402


def index(request):
    return HttpResponse(b"hello from django")


urlpatterns = [path("", index), path("admin/", admin.site.urls)]
application = get_wsgi_application()

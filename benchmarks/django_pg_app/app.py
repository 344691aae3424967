"""The WSGI application: settings in code, two views.

- `/`: two queries (an author by a random id, then that author's ten latest articles), a 50 ms
  wait standing for an upstream call (`time.sleep(0.05)`), and a template render.
- `/slow`: a 3-second request (`time.sleep(3)`), the kind that holds a thread.

Environment: BENCH_PG_HOST, BENCH_PG_PORT, BENCH_PG_DB, BENCH_PG_USER (PostgreSQL); BENCH_PG_CONN
`persistent` (default: one connection per thread kept across requests, CONN_MAX_AGE) or `pool`
(Django's psycopg pool, BENCH_PG_POOL connections per process, 100 by default); BENCH_AUTHORS
(rows in the author table, 100 by default).
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import django
from django.conf import settings

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # `django_pg_app` importable whatever the server's cwd

_pool = os.environ.get("BENCH_PG_CONN", "persistent") == "pool"
_db = {
    "ENGINE": "django.db.backends.postgresql",
    "HOST": os.environ.get("BENCH_PG_HOST", "127.0.0.1"),
    "PORT": os.environ.get("BENCH_PG_PORT", "5432"),
    "NAME": os.environ.get("BENCH_PG_DB", "bench"),
    "USER": os.environ.get("BENCH_PG_USER", "bench"),
    "PASSWORD": "",
    # A pool hands connections back at the end of each request (CONN_MAX_AGE must be 0 with it);
    # otherwise each thread keeps its own connection for 10 minutes.
    "CONN_MAX_AGE": 0 if _pool else 600,
    "CONN_HEALTH_CHECKS": False,
    "OPTIONS": {
        "pool": {"min_size": 4, "max_size": int(os.environ.get("BENCH_PG_POOL", "100")), "timeout": 30}
    }
    if _pool
    else {},
}

settings.configure(
    DEBUG=False,
    SECRET_KEY="benchmark-only-not-secret",
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=["django.contrib.contenttypes", "django_pg_app"],
    MIDDLEWARE=[
        "django.middleware.security.SecurityMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
    ],
    DATABASES={"default": _db},
    TEMPLATES=[
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "DIRS": [str(HERE / "templates")],
            "APP_DIRS": False,
            "OPTIONS": {},  # DEBUG off: the cached loader
        }
    ],
    USE_TZ=True,
    TIME_ZONE="UTC",
    LOGGING_CONFIG=None,
)
django.setup()

from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.shortcuts import render  # noqa: E402
from django.urls import path  # noqa: E402

from django_pg_app.models import Article, Author  # noqa: E402

AUTHORS = int(os.environ.get("BENCH_AUTHORS", "100"))
UPSTREAM_WAIT = 0.05
SLOW_WAIT = 3.0


def page(request: HttpRequest) -> HttpResponse:
    author = Author.objects.get(pk=random.randint(1, AUTHORS))  # query 1
    articles = list(Article.objects.filter(author=author).order_by("-published")[:10])  # query 2
    time.sleep(UPSTREAM_WAIT)  # stands for an upstream HTTP call
    return render(
        request,
        "page.html",
        {"author": author, "articles": articles, "total_views": sum(a.views for a in articles)},
    )


def slow(request: HttpRequest) -> HttpResponse:
    time.sleep(SLOW_WAIT)
    return HttpResponse(b"slow done\n", content_type="text/plain")


urlpatterns = [path("", page), path("slow", slow)]

application = get_wsgi_application()

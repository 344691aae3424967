"""The one view: which worker answered, and which PostgreSQL backend its connection talks to."""

import os

from django.db import connection
from django.http import JsonResponse
from django.urls import path


def backend(request):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (backend_pid,) = cursor.fetchone()
    return JsonResponse({"worker_pid": os.getpid(), "backend": backend_pid})


urlpatterns = [path("", backend)]

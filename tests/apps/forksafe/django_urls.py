"""The one view: which worker answered, and which PostgreSQL backend its connection talks to."""

import os

from django.http import JsonResponse
from django.urls import path

from apps.forksafe.django_app import IMPORT_BACKEND, current_backend


def backend(request):
    return JsonResponse(
        {"worker_pid": os.getpid(), "backend": current_backend(), "import_backend": IMPORT_BACKEND}
    )


urlpatterns = [path("", backend)]

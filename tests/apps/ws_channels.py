"""A Django Channels app with WebSockets, for the real-client tests (tests/asgi/test_websocket_clients.py).

Configured in code (``settings.configure``: no project directory, no database). The same endpoints
and protocol as ws_fastapi.py (see ws_shared.py):

- ``/ws/echo``: an ``AsyncWebsocketConsumer`` echo;
- ``/ws/room``: broadcast through a group of the in-memory channel layer. That layer lives in the
  process's memory: a broadcast reaches the clients connected to the same worker process only (a
  broadcast across workers needs a shared layer such as channels_redis);
- ``/ws/deny``: closes before accepting (the server must answer 403);
- ``/ws/deny-body``: refuses with its own HTTP response (401 "custom denial", the ASGI denial
  response extension);
- everything else is HTTP, routed by ``ProtocolTypeRouter`` to Django views: ``/`` (the browser
  page), ``/report``, ``/closes``.

Serve it with ``refork --chdir tests apps.ws_channels:application`` or
``uvicorn --app-dir tests apps.ws_channels:application``.
"""

from __future__ import annotations

import json
from typing import Any

import django
from django.conf import settings

if not settings.configured:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="refork-tests-only",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        INSTALLED_APPS=["channels"],
        MIDDLEWARE=[],
        DATABASES={},
        USE_TZ=True,
        CHANNEL_LAYERS={"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}},
    )
    django.setup()

from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402 - after settings
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402
from django.http import HttpRequest, HttpResponse, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402

from apps import ws_shared  # noqa: E402

ROOM = "room"


class Echo(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        self.tag = _query(self.scope).get("tag")
        await self.accept(
            subprotocol=ws_shared.pick_subprotocol(self.scope.get("subprotocols", [])),
            headers=[ws_shared.ACCEPT_HEADER],
        )

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data is not None:
            command = ws_shared.parse_close_command(text_data)
            if command is not None:
                await self.close(code=command[0], reason=command[1])
            elif text_data == "!scope":
                await self.send(text_data=json.dumps(ws_shared.scope_summary(self.scope)))
            else:
                await self.send(text_data=text_data)
        else:
            await self.send(bytes_data=bytes_data or b"")

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        ws_shared.record_close(self.tag, message)
        await super().websocket_disconnect(message)


class Room(AsyncWebsocketConsumer):
    groups = [ROOM]  # joined before connect() runs

    async def connect(self) -> None:
        await self.accept()
        await self.send(text_data=json.dumps({"event": "joined"}))

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self.channel_layer.group_send(ROOM, {"type": "room.message", "text": text_data or ""})

    async def room_message(self, event: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps({"event": "message", "text": event["text"]}))


class Deny(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        await self.close(code=1008)


class DenyWithBody(AsyncWebsocketConsumer):
    """The denial response extension: Channels has no helper, the consumer sends the messages."""

    async def connect(self) -> None:
        status, body = ws_shared.DENIAL
        start = {"type": "websocket.http.response.start", "status": status}
        await self.base_send({**start, "headers": [(b"content-type", b"text/plain")]})
        await self.base_send({"type": "websocket.http.response.body", "body": body})


def _query(scope: dict[str, Any]) -> dict[str, str]:
    from urllib.parse import parse_qsl

    return dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))


def page(request: HttpRequest) -> HttpResponse:
    return HttpResponse(ws_shared.PAGE, content_type="text/html; charset=utf-8")


def report(request: HttpRequest) -> HttpResponse:
    if ws_shared.record_report(request.GET.dict()):
        return HttpResponse("ok", content_type="text/plain")
    return HttpResponse("bad token", status=400, content_type="text/plain")


def closes(request: HttpRequest) -> HttpResponse:
    seen = ws_shared.read_close(request.GET.get("tag", ""))
    return JsonResponse(seen) if seen is not None else JsonResponse({"error": "not yet"}, status=404)


urlpatterns = [path("", page), path("report", report), path("closes", closes)]

application = ProtocolTypeRouter(
    {
        "http": get_asgi_application(),
        "websocket": URLRouter(
            [
                path("ws/echo", Echo.as_asgi()),
                path("ws/room", Room.as_asgi()),
                path("ws/deny", Deny.as_asgi()),
                path("ws/deny-body", DenyWithBody.as_asgi()),
            ]
        ),
    }
)

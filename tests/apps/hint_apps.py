"""103 Early Hints, as WSGI (`wsgi`: gunicorn's ``environ["wsgi.early_hints"]``) and as ASGI
(`asgi`: the ``http.response.early_hint`` extension), for tests/serving/test_early_hints.py.

- `/`: two hints (a stylesheet; a script and a font), then "page"
- `/started`: one hint after start_response / http.response.start (the head not out yet)
- `/late`: a hint after the first body bytes went out (ignored), then the rest of the body
- `/bad`: a hint whose value holds CR LF (an app error: a 500, nothing split)
- `/error`: a hint, then the app fails (the 103, then a 500)
- `/offered`: whether the hint callable / extension is there ("yes" or "no")
- WSGI only, `/many?N`: N hints of 4 KiB each, then it touches the file $HINTS_DONE and answers
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

STYLE = "</style.css>; rel=preload; as=style"
SCRIPT = "</app.js>; rel=preload; as=script"
FONT = "</font.woff2>; rel=preload; as=font; crossorigin"


def wsgi(environ: dict[str, Any], start_response: Any) -> Any:
    path = environ["PATH_INFO"]
    hints = environ.get("wsgi.early_hints")
    if path == "/offered":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"yes" if callable(hints) else b"no"]
    if path == "/":
        hints([("Link", STYLE)])
        hints([(b"Link", SCRIPT.encode()), ("Link", "  " + FONT + "\t")])  # bytes too; trimmed
    elif path == "/started":
        start_response("200 OK", [("Content-Type", "text/plain")])
        hints([("Link", STYLE)])
        return [b"page"]
    elif path == "/late":
        start_response("200 OK", [("Content-Type", "text/plain")])

        def body() -> Iterator[bytes]:
            yield b"pa"
            hints([("Link", STYLE)])  # the head is out: ignored
            yield b"ge"

        return body()
    elif path == "/bad":
        hints([("Link", "</a.css>\r\nX-Split: yes")])
    elif path == "/error":
        hints([("Link", STYLE)])
        raise RuntimeError("failed after a hint (expected by the test)")
    elif path == "/many":
        for i in range(int(environ["QUERY_STRING"])):
            hints([("Link", f"</{i}>; rel=preload; x={'x' * 4096}")])
        open(os.environ["HINTS_DONE"], "w").close()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "4")])
    return [b"page"]


async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    path = scope["path"]
    start = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}

    async def hint(*links: str) -> None:
        await send({"type": "http.response.early_hint", "links": [link.encode() for link in links]})

    if path == "/offered":
        body = b"yes" if "http.response.early_hint" in scope["extensions"] else b"no"
        await send({**start, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})
        return
    if path == "/":
        await hint(STYLE)
        await hint(SCRIPT, "  " + FONT + "\t")
    elif path == "/started":
        await send(start)
        await hint(STYLE)
        await send({"type": "http.response.body", "body": b"page"})
        return
    elif path == "/late":
        await send(start)
        await send({"type": "http.response.body", "body": b"pa", "more_body": True})
        await hint(STYLE)  # the head is out: ignored
        await send({"type": "http.response.body", "body": b"ge"})
        return
    elif path == "/bad":
        await hint("</a.css>\r\nX-Split: yes")
    elif path == "/error":
        await hint(STYLE)
        raise RuntimeError("failed after a hint (expected by the test)")
    await send({**start, "headers": [(b"content-type", b"text/plain"), (b"content-length", b"4")]})
    await send({"type": "http.response.body", "body": b"page"})

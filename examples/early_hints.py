"""103 Early Hints: the browser fetches the stylesheet and the script while the page is still
being made. The same page as WSGI (`app`) and as ASGI (`asgi_app`).

Run:  refork --chdir examples early_hints:app
      refork --chdir examples --interface asgi early_hints:asgi_app
See:  curl -v http://127.0.0.1:8000/      (the 103 comes first, then the 200)
"""

import asyncio
import time

LINKS = ["</style.css>; rel=preload; as=style", "</app.js>; rel=preload; as=script"]
PAGE = b'<!doctype html><link rel="stylesheet" href="/style.css"><script src="/app.js"></script>\n'
ASSETS = {"/style.css": (b"text/css", b"body { font: 16px sans-serif }\n"),
          "/app.js": (b"text/javascript", b"console.log('early');\n")}  # fmt: skip


def app(environ, start_response):
    asset = ASSETS.get(environ["PATH_INFO"])
    if asset is None:
        # gunicorn's API: a no-op for an HTTP/1.0 client, ignored once the response head is out
        environ["wsgi.early_hints"]([("Link", link) for link in LINKS])
        time.sleep(0.2)  # the page takes a while (a database, a template...)
        asset = (b"text/html", PAGE)
    kind, body = asset
    start_response("200 OK", [("Content-Type", kind.decode()), ("Content-Length", str(len(body)))])
    return [body]


async def asgi_app(scope, receive, send):
    if scope["type"] != "http":
        return
    asset = ASSETS.get(scope["path"])
    if asset is None:
        if "http.response.early_hint" in scope["extensions"]:  # (not offered to HTTP/1.0)
            await send({"type": "http.response.early_hint", "links": [link.encode() for link in LINKS]})
        await asyncio.sleep(0.2)
        asset = (b"text/html", PAGE)
    kind, body = asset
    headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})

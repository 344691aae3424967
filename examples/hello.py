"""The bundled example: a small WSGI app. Run: refork --chdir examples -w 2 hello:app"""

import os


def app(environ, start_response):
    if environ["PATH_INFO"] == "/pid":
        body = f"{os.getpid()}\n".encode()
    else:
        body = b"Hello from refork!\n"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]

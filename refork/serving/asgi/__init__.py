"""The ASGI loop on asyncio / uvloop: the server (listeners, lifespan, drain, safe points), the
HTTP/1.1 protocol of a connection, the WebSocket protocol it upgrades to, zero-copy file bodies
(sendfile) and listeners behind a PROXY-protocol sender (proxied_listener)."""

# gunicorn's own ASGI worker (gunicorn 24+), with the dirty arbiter left off.
bind = "127.0.0.1:8000"
workers = 2
worker_class = "asgi"
asgi_loop = "asyncio"
asgi_lifespan = "auto"
asgi_disconnect_grace_period = 3
http_parser = "auto"
websocket_max_message_size = 0
root_path = ""
dirty_apps = []
dirty_workers = 0
dirty_timeout = 300
dirty_threads = 1
dirty_graceful_timeout = 30
control_socket = None


def on_dirty_starting(arbiter):
    pass


def dirty_post_fork(arbiter, worker):
    pass


def dirty_worker_init(worker):
    pass


def dirty_worker_exit(arbiter, worker):
    pass

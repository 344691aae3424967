# A Django site on a VM behind nginx: gunicorn's example_config.py, the way most projects copy it.
import multiprocessing
import os

_log_dir = os.environ.get("LOG_DIR", "/var/log/gunicorn")

wsgi_app = "apps.wsgi_apps:app"
bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
backlog = 2048

workers = 2  # multiprocessing.cpu_count() * 2 + 1 in production
worker_class = "sync"
worker_connections = 1000
threads = 1
max_requests = 1000
max_requests_jitter = 50
timeout = 30
graceful_timeout = 30
keepalive = 2

limit_request_line = 4094
limit_request_fields = 100
limit_request_field_size = 8190

preload_app = True
pidfile = os.path.join(_log_dir, "gunicorn.pid")
umask = 0o007
tmp_upload_dir = None
worker_tmp_dir = "/dev/shm"
raw_env = ["DJANGO_SETTINGS_MODULE=mysite.settings"]
forwarded_allow_ips = "127.0.0.1,::1"
secure_scheme_headers = {"X-FORWARDED-PROTOCOL": "ssl", "X-FORWARDED-PROTO": "https", "X-FORWARDED-SSL": "on"}

errorlog = os.path.join(_log_dir, "error.log")
loglevel = "info"
accesslog = os.path.join(_log_dir, "access.log")
access_log_format = '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s" %(D)s'
capture_output = True
proc_name = "mysite"

cpu_count = multiprocessing.cpu_count()  # a helper: not a setting, ignored


def on_starting(server):
    server.log.info("Starting mysite (%s workers)", server.cfg.workers)


def on_reload(server):
    server.log.info("Reloading")


def when_ready(server):
    server.log.info("Server is ready. Spawning workers")


def pre_fork(server, worker):
    pass


def post_fork(server, worker):
    server.log.info("Worker spawned (pid: %s)", worker.pid)


def post_worker_init(worker):
    worker.log.info("Worker initialized (pid: %s)", worker.pid)


def worker_int(worker):
    worker.log.info("worker received INT or QUIT signal")


def worker_abort(worker):
    worker.log.info("worker received SIGABRT signal")


def pre_exec(server):
    server.log.info("Forked child, re-executing.")


def pre_request(worker, req):
    worker.log.debug("%s %s", req.method, req.path)


def post_request(worker, req, environ, resp):
    pass


def child_exit(server, worker):
    server.log.info("child %s exited", worker.pid)


def worker_exit(server, worker):
    server.log.info("worker %s exiting", worker.pid)


def nworkers_changed(server, new_value, old_value):
    server.log.info("workers: %s -> %s", old_value, new_value)


def on_exit(server):
    server.log.info("Bye")

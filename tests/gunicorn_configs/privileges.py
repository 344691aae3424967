# Started as root by an init script: drop to an unprivileged user, daemonize, keep a pid file.
import os

bind = "127.0.0.1:8000"
user = "nobody"
group = "nogroup"
initgroups = False
umask = 0o022
pidfile = os.path.join(os.environ.get("LOG_DIR", "/run"), "app.pid")
daemon = False

# A service that logs through dictConfig (JSON lines to stdout) and to syslog, with StatsD.
import os

bind = "127.0.0.1:8000"
workers = 2
loglevel = "debug"
errorlog = "-"
accesslog = "-"
disable_redirect_access_to_syslog = True
logger_class = "gunicorn.glogging.Logger"
syslog = True
syslog_addr = os.environ.get("SYSLOG_ADDR", "udp://127.0.0.1:514")
syslog_prefix = "shop"
syslog_facility = "local0"
enable_stdio_inheritance = False
statsd_host = os.environ.get("STATSD_HOST", "127.0.0.1:8125")
statsd_prefix = "shop"
dogstatsd_tags = "env:test,service:shop"
enable_backlog_metric = True
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"format": '{"time": "%(asctime)s", "level": "%(levelname)s", "msg": "%(message)s"}'},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stdout"},
    },
    "loggers": {
        "gunicorn.error": {"level": "INFO", "handlers": ["console"], "propagate": False},
        "gunicorn.access": {"level": "INFO", "handlers": ["console"], "propagate": False},
    },
}

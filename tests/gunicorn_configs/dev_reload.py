# Development: reload on code and template changes.
import os

bind = "127.0.0.1:8000"
reload = True
reload_engine = "auto"
reload_extra_files = [os.path.join(os.environ.get("LOG_DIR", "."), "templates", "*.html")]
spew = False
check_config = False
print_config = False
daemon = False
pythonpath = os.environ.get("EXTRA_PATH", "apps")
paste = None
raw_paste_global_conf = []
default_proc_name = "dev"
user = None
group = None
initgroups = False
chdir = os.environ.get("APP_DIR", ".")

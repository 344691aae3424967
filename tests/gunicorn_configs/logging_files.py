# logconfig (fileConfig .ini) and logconfig_json, as Flask shops ship them next to the app.
import os

_here = os.environ.get("LOG_DIR", ".")
bind = "127.0.0.1:8000"
logconfig = os.path.join(_here, "logging.ini")
logconfig_json = os.path.join(_here, "logging.json")

"""hello_wsgi wrapped in WhiteNoise serving $STATIC_BENCH_DIR at /static/ (benchmarks/static_files.py)."""

import os

from hello_wsgi import app as hello
from whitenoise import WhiteNoise

app = WhiteNoise(hello, root=os.environ["STATIC_BENCH_DIR"], prefix="/static/")

"""bench_settings without WhiteNoise: the same collected, hashed and compressed files (STATIC_ROOT)
are served by refork's `--static /static=...` mount (run.py's refork-static setup), so the app
neither loads WhiteNoise's middleware nor indexes the files."""

from bench_settings import *  # noqa: F403

MIDDLEWARE = [m for m in MIDDLEWARE if not m.startswith("whitenoise.")]  # noqa: F405

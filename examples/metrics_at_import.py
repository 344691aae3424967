"""The mistake: the metrics thread starts while the app loads, so it runs in the mold only."""

from metrics import app, start_flusher

start_flusher()

__all__ = ["app"]

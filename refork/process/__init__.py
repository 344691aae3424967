"""Process management: monitor, mold, workers. Nothing in here knows about HTTP."""

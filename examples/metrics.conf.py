"""The fix: start the metrics thread in each worker, after the fork."""


def post_fork(server, worker):
    import metrics

    metrics.start_flusher()

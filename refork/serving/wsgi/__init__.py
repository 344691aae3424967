"""The WSGI loops: the native engines' hosts (engine_host, pool_host, sharing native_host), the
Python loop each of them owns (python_loop; its parts: accepting, request_path, app_handoff,
own_answers; what serves beside it: beside; its per-connection records in conn, its native parts
in native_parts), the app threads of ``--threads`` > 1 (app_threads), and which of them a worker
runs (choice)."""

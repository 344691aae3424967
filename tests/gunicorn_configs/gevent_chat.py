# A Flask-SocketIO-era app on gevent, as its README has it.
bind = "0.0.0.0:5000"
worker_class = "gevent"
worker_connections = 200
workers = 1
timeout = 0

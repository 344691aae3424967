# TLS terminated by gunicorn itself, with mTLS and an ssl_context hook raising the minimum version.
import os

_certs = os.environ.get("CERT_DIR", "/etc/ssl/app")
bind = "127.0.0.1:8443"
certfile = os.path.join(_certs, "server.pem")
keyfile = os.path.join(_certs, "server.key")
ca_certs = os.path.join(_certs, "ca.pem")
cert_reqs = 1
ciphers = "ECDHE+AESGCM:ECDHE+CHACHA20"
ssl_version = 2
suppress_ragged_eofs = True
do_handshake_on_connect = False
http_protocols = "h2,h1"
http2_max_concurrent_streams = 100
http2_initial_window_size = 65535
http2_max_frame_size = 16384
http2_max_header_list_size = 65536
http2_cleartext = "off"


def ssl_context(conf, default_ssl_context_factory):
    import ssl

    context = default_ssl_context_factory()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context

"""Certificates for the TLS tests: a CA, a server and a client, made with trustme."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from pathlib import Path

import trustme


class Certs:
    """A CA, a server certificate for 127.0.0.1 / localhost and a client certificate, as files."""

    def __init__(self, where: Path, name: str = "") -> None:
        self.ca = trustme.CA()
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        client = self.ca.issue_cert("client@example.com")
        self.ca_pem = where / f"ca{name}.pem"
        self.cert = where / f"cert{name}.pem"
        self.key = where / f"key{name}.pem"
        self.client_cert = where / f"client{name}.pem"
        self.client_key = where / f"client-key{name}.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_pem))
        server.private_key_pem.write_to_path(str(self.key))
        with open(self.cert, "wb") as f:
            for pem in server.cert_chain_pems:
                f.write(pem.bytes())
        self.server_cert_pem = server.cert_chain_pems[0].bytes()
        client.private_key_pem.write_to_path(str(self.client_key))
        client.cert_chain_pems[0].write_to_path(str(self.client_cert))

    def args(self) -> list[str]:
        return ["--certfile", str(self.cert), "--keyfile", str(self.key)]

    def client_context(self, alpn: Sequence[str] = ("http/1.1",)) -> ssl.SSLContext:
        """A client's context trusting the CA, offering `alpn` (HTTP/1.1 unless a test says h2)."""
        ctx = ssl.create_default_context(cafile=str(self.ca_pem))
        ctx.set_alpn_protocols(list(alpn))
        return ctx

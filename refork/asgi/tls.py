"""The ASGI ``tls`` scope extension: what the TLS layer of a connection knows, for mTLS apps.

Built once per connection from its ``ssl.SSLObject`` (asyncio's and uvloop's ``ssl_object`` extra)
and copied into each scope of the connection as ``scope["extensions"]["tls"]``. Fields follow the
ASGI TLS extension spec: the client's certificate as PEM and its subject as an RFC 4514 string
(only when the certificate was verified: ``--cert-reqs`` optional or required with ``--ca-certs``),
the protocol version and the cipher suite as the numbers TLS puts on the wire. ``server_cert`` is
None: Python's ssl module does not show the certificate it sent.
"""

from __future__ import annotations

import ssl
import weakref
from typing import Any

TLS_VERSIONS = {"TLSv1": 0x0301, "TLSv1.1": 0x0302, "TLSv1.2": 0x0303, "TLSv1.3": 0x0304}
# RFC 4514 section 3's short names; other attributes keep OpenSSL's long name
SHORT_NAMES = {
    "commonName": "CN",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
_SUITES: weakref.WeakKeyDictionary[ssl.SSLContext, dict[str, int]] = weakref.WeakKeyDictionary()


def tls_extension(ssl_object: Any) -> dict[str, Any]:
    """The extension's dict for one connection (each scope gets its own copy)."""
    der = ssl_object.getpeercert(binary_form=True)
    verified = ssl_object.getpeercert() if der else None  # {} when not verified (CERT_NONE)
    cipher = ssl_object.cipher()
    return {
        "server_cert": None,
        "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else [],
        "client_cert_name": rfc4514_name(verified["subject"]) if verified else None,
        "client_cert_error": None,  # a certificate that fails verification ends the handshake
        "tls_version": TLS_VERSIONS.get(ssl_object.version() or ""),
        "cipher_suite": _suite_number(ssl_object.context, cipher[0]) if cipher else None,
    }


def rfc4514_name(subject: tuple[tuple[tuple[str, str], ...], ...]) -> str:
    """ssl's subject (RDNs, most significant first) as RFC 4514 text (least significant first)."""
    rdns = ("+".join(f"{SHORT_NAMES.get(k, k)}={_escape(v)}" for k, v in rdn) for rdn in reversed(subject))
    return ",".join(rdns)


def _escape(value: str) -> str:
    """RFC 4514 2.4: the special characters, a leading '#' or space, a trailing space."""
    out = "".join("\\" + ch if ch in ',+"\\<>;' else ch for ch in value)
    if out[:1] in ("#", " "):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def _suite_number(context: ssl.SSLContext, name: str) -> int | None:
    """A cipher's IANA number (e.g. 0x1301 for TLS_AES_128_GCM_SHA256), read from OpenSSL's table
    once per context (ssl names the negotiated cipher only by its OpenSSL name)."""
    table = _SUITES.get(context)
    if table is None:  # per context: its cipher list is the one it was configured with
        table = {c["name"]: c["id"] & 0xFFFF for c in context.get_ciphers()}
        _SUITES[context] = table
    return table.get(name)

"""The ASGI `tls` extension's pure parts (end to end: tests/serving/test_tls.py)."""

from __future__ import annotations

import pytest
from cryptography.x509 import Name, NameAttribute
from cryptography.x509.oid import NameOID

from refork.asgi.tls import rfc4514_name

LONG = {NameOID.COUNTRY_NAME: "countryName", NameOID.ORGANIZATION_NAME: "organizationName",
        NameOID.COMMON_NAME: "commonName", NameOID.EMAIL_ADDRESS: "emailAddress"}  # fmt: skip


@pytest.mark.parametrize(
    "attributes",
    [
        [(NameOID.COUNTRY_NAME, "DE"), (NameOID.ORGANIZATION_NAME, "Shop"), (NameOID.COMMON_NAME, "api")],
        [(NameOID.ORGANIZATION_NAME, 'A, B+C "D" <E>; F\\G'), (NameOID.COMMON_NAME, "#x=y ")],
        [(NameOID.COMMON_NAME, " lead")],
    ],
)
def test_subject_reads_as_cryptography_writes_it(attributes):
    name = Name([NameAttribute(oid, value) for oid, value in attributes])
    subject = tuple(((LONG[oid], value),) for oid, value in attributes)  # ssl's getpeercert() form
    assert rfc4514_name(subject) == name.rfc4514_string()

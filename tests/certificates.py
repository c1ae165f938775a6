"""Certificates for TLS tests, made on the spot (nothing read from the internet or ../shared)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path


def certificates(where: Path) -> dict[str, Path]:
    """A test CA and a server (localhost, 127.0.0.1) and client certificate it signed, as PEM
    files in `where`: ca.crt, server.crt/.key, client.crt/.key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def make(name, issuer_key=None, issuer_name=None, *, ca=False, san=None):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name or subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = builder.sign(issuer_key or key, hashes.SHA256())
        return key, cert

    ca_key, ca_cert = make("tfservo test CA", ca=True)
    files = {}
    for role, san in (("server", [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                      ("client", None)):
        key, cert = make(role, ca_key, ca_cert.subject, san=san)
        files[f"{role}.key"] = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        files[f"{role}.crt"] = cert.public_bytes(serialization.Encoding.PEM)
    files["ca.crt"] = ca_cert.public_bytes(serialization.Encoding.PEM)
    paths = {}
    for name, data in files.items():
        (where / name).write_bytes(data)
        paths[name] = where / name
    return paths

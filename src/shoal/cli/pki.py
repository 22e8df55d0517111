"""Certificates for ``shoal up --tls``: a self-signed CA and one server certificate it
signs, for the master's API and every worker's TCP port (all on this host).

Kept in ``<cluster dir>/tls`` (keys mode 600) and reused when the cluster starts again
from the same directory, so clients keep trusting the same CA (``ca.pem``: what
``SHOAL_TLS_CA`` or ``ClientSettings.tls_ca`` names; ``shoal up`` also records it
with the cluster's credentials). Needs the ``cryptography`` package.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.errors import InvalidArgument

#: days the generated certificates are valid
DAYS = 365


@dataclass(frozen=True)
class LocalPKI:
    ca: Path
    cert: Path
    key: Path


def local_pki(dir: Path, host: str, also: Iterable[str] = ()) -> LocalPKI:
    """The CA and the server certificate for ``host`` (plus the addresses in ``also``)
    under ``dir``, made once. Tests and benchmarks make theirs here too."""
    out = LocalPKI(dir / "ca.pem", dir / "server.pem", dir / "server.key")
    if out.ca.exists() and out.cert.exists() and out.key.exists():
        return out
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise InvalidArgument(
            "shoal up --tls needs the cryptography package (pip install cryptography), "
            "or pass your own certificates to shoal master/worker --tls-cert/--tls-key"
        ) from None
    dir.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shoal local CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[Any] = [x509.DNSName("localhost"), x509.DNSName(socket.gethostname())]
    ips = {"127.0.0.1", "::1", *also}
    try:
        ipaddress.ip_address(host)
        if host not in ("0.0.0.0", "::"):
            ips.add(host)
    except ValueError:
        names.append(x509.DNSName(host))
    names += [x509.IPAddress(ipaddress.ip_address(i)) for i in sorted(ips)]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shoal")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    _write(out.key, key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()), 0o600)  # fmt: skip
    _write(out.cert, cert.public_bytes(pem), 0o644)
    _write(out.ca, ca.public_bytes(pem), 0o644)  # last: its presence means all are there
    return out


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)

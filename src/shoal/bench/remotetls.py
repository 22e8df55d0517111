"""TLS for the ``remote`` workload: a self-signed certificate for the test subnet's
addresses, and whether this tree's worker and client speak TLS yet."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import subprocess
import sys
from pathlib import Path


def tls_supported() -> str | None:
    """Why the TLS variant cannot run here (None: it can): the client's ``tls_ca``
    setting and the worker's ``--tls-cert`` flag must both exist."""
    from shoal.config import ClientSettings

    if "tls_ca" not in {f.name for f in dataclasses.fields(ClientSettings)}:
        return "ClientSettings has no tls_ca yet (TLS on the data path is not in this tree)"
    r = subprocess.run([sys.executable, "-m", "shoal", "worker", "--help"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    if "--tls-cert" not in r.stdout:
        return "`shoal worker` has no --tls-cert yet (TLS on the data path is not in this tree)"
    return None


def make_cert(dir: Path, subnet: str) -> None:
    """``cert.pem`` and ``key.pem`` in ``dir``: self-signed, valid for every address of
    ``subnet`` (IP SANs), so the cert is its own CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    dir.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shoal-bench")])
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = [x509.IPAddress(a) for a in ipaddress.ip_network(subnet).hosts()]
    sans.append(x509.DNSName("localhost"))
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (dir / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (dir / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (dir / "key.pem").chmod(0o600)

"""TLS for the ``remote`` workload: a certificate for the test subnet's addresses
(signed by the CA ``shoal up --tls`` would make), and whether this tree's worker and
client speak TLS."""

from __future__ import annotations

import dataclasses
import ipaddress
import shutil
import subprocess
import sys
from pathlib import Path

from shoal.cli.pki import local_pki


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


def make_cert(dir: Path, subnet: str) -> Path:
    """``cert.pem`` and ``key.pem`` in ``dir``, signed by the CA ``shoal up --tls`` makes
    (:func:`shoal.cli.pki.local_pki`), valid for every address of ``subnet`` (IP SANs).
    Returns the CA's file (what readers trust)."""
    pki = local_pki(
        dir / "pki", "127.0.0.1", (str(a) for a in ipaddress.ip_network(subnet).hosts())
    )
    shutil.copyfile(pki.cert, dir / "cert.pem")
    shutil.copyfile(pki.key, dir / "key.pem")
    (dir / "key.pem").chmod(0o600)
    return pki.ca

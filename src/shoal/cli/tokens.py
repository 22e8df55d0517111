"""``shoal token create``: tokens for readers, workers and admins.

The master mints them (admin only) with the cluster secret; ``shoal up`` stores the
admin's token in ``<shoal home>/credentials.json`` under the master's URL, where the
CLI, the Python client, fsspec and the mount find it (see shoal.config.token_for).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
from typing import Any

import aiohttp

from shoal.cli.output import add_json, add_master, emit_json
from shoal.config import CREDENTIALS_FILE, master_from_env, shoal_home
from shoal.core.tokens import ROLES
from shoal.errors import InvalidArgument
from shoal.proto.master_api import MasterAPI

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def register(sub: Any) -> None:
    p = sub.add_parser("token", help="create tokens for the cluster's API and data path")
    tsub = p.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    c = tsub.add_parser("create", help="mint a token (needs an admin token)")
    c.add_argument("--role", required=True, choices=ROLES, help="what the token may do")
    c.add_argument("--name", default=None, help="who holds it (shown in logs; default: the role)")
    c.add_argument(
        "--dataset",
        action="append",
        default=None,
        metavar="NAME",
        help="limit a reader token to this dataset (repeatable)",
    )
    c.add_argument("--ttl", default=None, metavar="DURATION", help="lifetime: 3600, 30m, 12h, 7d")
    add_master(c)
    add_json(c)
    c.set_defaults(handler=cmd_create)


def parse_ttl(text: str | None) -> float | None:
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise InvalidArgument(f"--ttl {text!r}: give a positive duration like 3600, 30m, 12h or 7d")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


async def _mint(master: str, name: str, role: str, ds: list[str] | None, ttl: float | None) -> str:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        return await MasterAPI(master, lambda: http).mint_token(name, role, ds, ttl)


def cmd_create(args: argparse.Namespace) -> int:
    master = master_from_env(args.master, hint="pass --master URL")
    ttl = parse_ttl(args.ttl)
    token = asyncio.run(_mint(master, args.name or args.role, args.role, args.dataset, ttl))
    if args.json:
        emit_json({"token": token, "role": args.role, "datasets": args.dataset, "ttl": ttl})
    else:
        print(token)
    return 0


def _saved() -> dict[str, Any]:
    try:
        saved = json.loads((shoal_home() / CREDENTIALS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def save_credentials(master: str, token: str | None, tls_ca: str | None = None) -> None:
    """Remember ``token`` (and the CA of a TLS cluster, ``tls_ca``) for ``master`` in
    ``<shoal home>/credentials.json`` (0600), where clients look them up."""
    saved = _saved()
    url = master.rstrip("/")
    if token:
        saved[url] = token
    cas = saved.get("tls_ca")
    cas = cas if isinstance(cas, dict) else {}
    if tls_ca:
        cas[url] = tls_ca
    else:
        cas.pop(url, None)
    if cas:
        saved["tls_ca"] = cas
    else:
        saved.pop("tls_ca", None)
    _write(saved)


def forget_credentials(master: str) -> None:
    """Drop what :func:`save_credentials` stored for ``master`` (its cluster is down)."""
    saved = _saved()
    url = master.rstrip("/")
    cas = saved.get("tls_ca")
    had_ca = isinstance(cas, dict) and cas.pop(url, None) is not None
    if isinstance(cas, dict) and not cas:
        saved.pop("tls_ca", None)
    if saved.pop(url, None) is not None or had_ca:
        _write(saved)


def _write(saved: dict[str, Any]) -> None:
    home = shoal_home()
    home.mkdir(parents=True, exist_ok=True)
    path = home / CREDENTIALS_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(saved, f, indent=1)
    os.replace(tmp, path)

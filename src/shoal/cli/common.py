"""Helpers shared by the client-side command groups."""

from __future__ import annotations

import argparse
import os

from shoal.cli.local import default_dir, load_state
from shoal.client import Client
from shoal.config import ENV_MASTER, master_from_env
from shoal.errors import InvalidArgument


def master_url(args: argparse.Namespace) -> str:
    explicit = getattr(args, "master", None) or os.environ.get(ENV_MASTER)
    if not explicit:
        state = load_state(default_dir())
        if state is None:
            raise InvalidArgument(
                f"no master: pass --master URL, set {ENV_MASTER}, or start one with `shoal up`"
            )
        explicit = state["master"]
    return master_from_env(explicit, hint="pass --master URL")


def client(args: argparse.Namespace) -> Client:
    return Client(master_url(args))


def parse_kv(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidArgument(f"invalid {what} {item!r}: expected KEY=VALUE")
        out[key.strip()] = value
    return out

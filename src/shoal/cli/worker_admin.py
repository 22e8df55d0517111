"""``shoal worker drain ID``: scale in by one worker without failing a read.

The master takes the worker out of the ring at once (readers and new owners move on);
the worker keeps serving while it hands each cached file to its new owner (peer
transfer, see :mod:`shoal.worker.drain`), then reports it is done and stops. With
``--wait`` the command returns once the worker has left.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import aiohttp

from shoal.cli.common import master_url
from shoal.cli.output import add_json, add_master, emit_json, human_bytes
from shoal.errors import InvalidArgument, Unavailable
from shoal.proto.master_api import MasterAPI

#: seconds between looks at the report while waiting
POLL = 0.2


def register(worker_parser: Any) -> None:
    acts = worker_parser.add_subparsers(dest="worker_action", metavar="ACTION")
    p = acts.add_parser(
        "drain", help="hand a worker's cached files to their next owners, then remove it"
    )
    p.add_argument("id", metavar="ID", help="the worker's id (see `shoal report`)")
    p.add_argument("--wait", action="store_true", help="return once the worker has left")
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="with --wait: give up after SECONDS (default 600)",
    )
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_drain)


async def _drain(master: str, wid: str, wait: bool, timeout: float) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        api = MasterAPI(master, lambda: http)
        out = await api.drain_worker(wid)
        if not wait:
            return out
        deadline = time.monotonic() + timeout
        while True:
            report = await api.report()
            w: Any = next((w for w in report["workers"] if w["id"] == wid), None)
            if w is None or w["state"] in ("left", "expired"):
                state = w["state"] if w is not None else "left"
                return {**out, "state": state, "moved": (w or {}).get("moved", {})}
            if time.monotonic() > deadline:
                raise Unavailable(f"worker {wid} is still draining after {timeout:g}s")
            await asyncio.sleep(POLL)


def cmd_drain(args: argparse.Namespace) -> int:
    if not args.timeout > 0:
        raise InvalidArgument(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    out = asyncio.run(_drain(master_url(args), args.id, args.wait, args.timeout))
    if args.json:
        emit_json(out)
    elif out["state"] == "draining":
        print(f"worker {args.id} is draining (out of the ring at epoch {out['epoch']})")
    else:
        m = out.get("moved") or {}
        print(
            f"worker {args.id} {out['state']}: handed over {m.get('files_out', 0)} files "
            f"({human_bytes(m.get('bytes_out', 0))})"
        )
    return 0

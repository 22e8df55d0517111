"""``shoal master backup FILE``, ``shoal master restore FILE`` and ``shoal master probe``.

A backup is taken online from a running master (see :mod:`shoal.master.backup`); a
restore installs one into the state directory of a master that is not running yet.
Start that master and point workers and clients at it: they accept a list of master
addresses (``--master URL,URL``), so a restored master on another host is found
without reconfiguring anyone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import tempfile
from typing import Any

import aiohttp

from shoal.cli.output import add_json, add_master, emit_json, human_bytes
from shoal.config import master_from_env
from shoal.errors import InvalidArgument
from shoal.master import backup, lease
from shoal.proto.master_api import MasterAPI


def register(master_parser: Any) -> None:
    acts = master_parser.add_subparsers(dest="master_action", metavar="ACTION")
    p = acts.add_parser("backup", help="write an online backup of a running master to FILE")
    p.add_argument("file", metavar="FILE", help="where to write the backup (a tar file)")
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_backup)

    p = acts.add_parser(
        "restore", help="install a backup as the state of a master that is not running"
    )
    p.add_argument("file", metavar="FILE", help="a backup written by `shoal master backup`")
    p.add_argument("--state-dir", required=True, help="the new master's state directory")
    p.add_argument(
        "--force",
        action="store_true",
        help="move existing state in --state-dir aside (to <dir>.before-restore-<time>)",
    )
    add_json(p)
    p.set_defaults(handler=cmd_restore)

    p = acts.add_parser(
        "probe",
        help="a liveness check that an active master and its standby both pass (exit 0), "
        "and a hung active master fails (exit 1)",
    )
    p.add_argument("--state-dir", required=True, help="the state directory the masters share")
    p.add_argument(
        "--pid",
        type=int,
        default=1,
        help="the pid of this container's master (1: the container's own process)",
    )
    p.add_argument("--timeout", type=float, default=3.0, help="seconds the health check may take")
    add_json(p)
    p.set_defaults(handler=cmd_probe)


async def _download(master: str, out: Any) -> int:
    timeout = aiohttp.ClientTimeout(total=None, connect=10)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        return await MasterAPI(master, lambda: http).backup(out)


def cmd_backup(args: argparse.Namespace) -> int:
    master = master_from_env(args.master, hint="pass --master URL")
    dest = os.path.abspath(args.file)
    directory = os.path.dirname(dest)
    if not os.path.isdir(directory):
        raise InvalidArgument(f"cannot write {args.file}: {directory} is not a directory")
    fd, tmp = tempfile.mkstemp(prefix=".backup-", suffix=".tar", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            asyncio.run(_download(master, f))
            f.flush()
            os.fsync(f.fileno())
        index = backup.verify(tmp)  # never leave a damaged backup under the given name
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    out = {"file": args.file, "size": os.path.getsize(dest), **index}
    if args.json:
        emit_json(out)
    else:
        print(
            f"backed up {index['datasets']} datasets, {index['jobs']} jobs and "
            f"{index['manifests']} manifests to {args.file} ({human_bytes(out['size'])})"
        )
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    index = backup.restore(args.file, args.state_dir, force=args.force)
    if args.json:
        emit_json({"state_dir": args.state_dir, **index})
    else:
        print(
            f"restored {index['datasets']} datasets, {index['jobs']} jobs and "
            f"{index['manifests']} manifests into {args.state_dir}; start the master with "
            f"`shoal master --state-dir {args.state_dir}`"
        )
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    """Liveness for a master that may be a standby (Kubernetes' exec probe): a standby
    binds no port, so an HTTP probe would restart it over and over. The lock file names
    the active master (pid and host); when that is this container's master, its health
    must answer, else this is the standby, alive while it waits."""
    if not os.path.isdir(args.state_dir):  # a typo must not pass as a waiting standby
        raise InvalidArgument(f"state directory {args.state_dir} does not exist")
    found = lease.holder(os.path.join(args.state_dir, lease.LOCK_NAME))
    me = found is not None and found.get("pid") == args.pid
    me = me and found is not None and found.get("host") == socket.gethostname()
    url = found.get("url") if found is not None else None
    if not me:
        state, ok = "standby", True
    elif not url:
        state, ok = "starting", True  # locked, not listening yet
    else:
        state, ok = "active", _healthy(str(url), args.timeout)
    if args.json:
        emit_json({"state": state, "ok": ok, "holder": lease.describe(found)})
    elif ok:
        print(f"{state}: {args.state_dir} is served by {lease.describe(found)}")
    else:
        print(f"unhealthy: the active master ({lease.describe(found)}) does not answer")
    return 0 if ok else 1


def _healthy(url: str, timeout: float) -> bool:
    import ssl
    import urllib.request

    ctx = ssl.create_default_context()
    ctx.check_hostname = False  # this pod's own master: only whether it answers
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"{url}/api/v1/health", timeout=timeout, context=ctx) as r:
            return bool(r.status == 200)
    except (OSError, ValueError):
        return False

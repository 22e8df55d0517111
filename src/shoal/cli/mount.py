"""``shoal mount MOUNTPOINT`` and ``shoal umount MOUNTPOINT``: the read-only POSIX
mount of /<dataset>/<mount>/<path> over the client.

Also runnable on its own as ``python -m shoal.cli.mount mount|umount ...``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from shoal.cli.common import master_url
from shoal.cli.output import add_json, emit_json, table


def register(sub: Any) -> None:
    p = sub.add_parser(
        "mount",
        help="mount datasets as a read-only file system (FUSE); `shoal mount ls` lists mounts",
    )
    p.add_argument(
        "mountpoint", help="directory to mount on (`ls`: list this host's shoal mounts instead)"
    )
    p.add_argument(
        "--dataset",
        action="append",
        metavar="NAME",
        help="show only this dataset at the top level (repeatable; default: all)",
    )
    p.add_argument("--master", help="master URL (default: $SHOAL_MASTER or `shoal up`'s)")
    p.add_argument("--foreground", action="store_true", help="stay attached, log to stderr")
    p.add_argument(
        "--metrics-port", type=int, metavar="PORT", help="serve /metrics on PORT (0: any free)"
    )
    p.add_argument(
        "--metrics-host", default="127.0.0.1", help="interface for --metrics-port (127.0.0.1)"
    )
    p.add_argument(
        "--no-passthrough",
        dest="passthrough",
        action="store_false",
        help="serve every read through the daemon, never by kernel passthrough",
    )
    p.add_argument(
        "--kernel-open",
        action="store_true",
        help="opens never reach the daemon: one round trip per small file instead of three "
        "(no passthrough for large files)",
    )
    p.add_argument("--readahead", type=int, default=8192, metavar="KIB", help="kernel readahead")
    p.add_argument("--state-dir", help="where pid, state and log files go (~/.shoal/mounts)")
    p.add_argument("--log-level", default="info", help="debug, info, warning or error")
    add_json(p)
    p.set_defaults(handler=cmd_mount)

    p = sub.add_parser("umount", help="unmount a shoal mount (also after its daemon crashed)")
    p.add_argument("mountpoint", help="the directory given to `shoal mount`")
    p.add_argument("--state-dir", help="where pid, state and log files go (~/.shoal/mounts)")
    p.set_defaults(handler=cmd_umount)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cmd_mount_ls(args: argparse.Namespace) -> int:
    """The mounts whose daemons left state in the state directory, alive or not."""
    from shoal.fuse import service

    sdir = Path(args.state_dir or service.default_state_dir())
    rows = []
    for f in sorted(sdir.glob("*.json")) if sdir.is_dir() else []:
        try:
            st = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(st, dict) or "mountpoint" not in st:
            continue
        pid = int(st.get("pid") or 0)
        rows.append(
            {
                "mountpoint": st["mountpoint"],
                "pid": pid,
                "state": "running" if pid and _alive(pid) else "dead (run `shoal umount`)",
                "master": st.get("master", ""),
                "passthrough": bool(st.get("passthrough", False)),
                "metrics_port": st.get("metrics_port"),
            }
        )
    if args.json:
        emit_json({"mounts": rows})
    else:
        table(
            None,
            ["mountpoint", "pid", "state", "master", "passthrough"],
            [(r["mountpoint"], r["pid"], r["state"], r["master"], r["passthrough"]) for r in rows],
        )
    return 0


def cmd_mount(args: argparse.Namespace) -> int:
    from shoal.fuse import service

    if args.mountpoint == "ls" and not Path("ls").is_dir():
        # `shoal mount ls`; a directory named ls is still mounted on (or use ./ls)
        return cmd_mount_ls(args)

    opts = service.MountOptions(
        mountpoint=str(Path(args.mountpoint).absolute()),
        master=master_url(args),
        datasets=tuple(args.dataset or ()),
        passthrough=args.passthrough,
        kernel_open=args.kernel_open,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        readahead_kb=args.readahead,
        state_dir=args.state_dir or str(service.default_state_dir()),
    )
    level = getattr(logging, args.log_level.upper(), logging.INFO)
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    notify = None
    if not args.foreground:
        log_path = service.state_base(opts.state_dir, opts.mountpoint).with_suffix(".log")
        notify = service.daemonize(log_path)
        if notify is None:
            print(f"mounted {opts.mountpoint} (log: {log_path})")
            return 0
    logging.basicConfig(level=level, format=fmt, stream=sys.stderr)
    import uvloop

    try:
        uvloop.run(service.serve(opts, notify))
    except KeyboardInterrupt:
        pass
    return 0


def cmd_umount(args: argparse.Namespace) -> int:
    from shoal.fuse import service

    if service.unmount(args.mountpoint, args.state_dir):
        print(f"unmounted {args.mountpoint}")
    else:
        print(f"{args.mountpoint} was not mounted")
    return 0


def main(argv: list[str] | None = None) -> None:
    """Entry point until ``shoal`` itself registers these commands."""
    from shoal.cli.main import exit_status
    from shoal.errors import ShoalError

    parser = argparse.ArgumentParser(prog="shoal")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    try:
        code = args.handler(args) or 0
    except ShoalError as exc:
        print(f"shoal: error: {exc.message}", file=sys.stderr)
        code = exit_status(exc)
    sys.exit(code)


if __name__ == "__main__":
    main()

"""``shoal up|down|master|worker``: run the roles."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from shoal.cli import master_admin, worker_admin
from shoal.cli.local import LocalCluster, default_dir, down, load_state
from shoal.cli.output import add_json, emit_json
from shoal.cli.tokens import forget_credentials, save_credentials
from shoal.config import MasterSettings, TierSpec, WorkerSettings, master_from_env, node_name
from shoal.core.types import parse_size
from shoal.errors import InvalidArgument, ShoalError


def register(sub: Any) -> None:
    p = sub.add_parser("up", help="start a local cluster (master + N workers) in the background")
    p.add_argument("--workers", type=int, default=2, help="number of workers (default 2)")
    p.add_argument(
        "--dir", type=Path, default=None, help="cluster directory (default ~/.shoal/cluster)"
    )
    p.add_argument(
        "--mem",
        default="0",
        help="memory tier (/dev/shm) per worker, e.g. 1GiB (default: none; the "
        "disk tier's page cache is faster here, see README)",
    )
    p.add_argument("--disk", default="4GiB", help="disk tier per worker")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind")
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="workers hand their cached files over on SIGTERM, for at most SECONDS "
        "(default 0: they stop at once)",
    )
    p.add_argument(
        "--no-auth",
        action="store_true",
        help="run without a cluster secret: anyone who reaches the ports may use the cluster",
    )
    p.add_argument(
        "--tls",
        action="store_true",
        help="TLS for the master's API and the workers' TCP ports, with a CA and a "
        "certificate generated in the cluster directory (clients find the CA by themselves)",
    )
    p.add_argument("--s3-gateway", type=int, metavar="PORT", help="also serve S3 on PORT (0: free)")
    p.add_argument(
        "--webhdfs-gateway", type=int, metavar="PORT", help="also serve WebHDFS on PORT (0: free)"
    )
    p.add_argument(
        "--gateway-credentials",
        metavar="FILE",
        help="the gateways' access keys (docs/gateway-auth.md)",
    )
    p.add_argument(
        "--gateway-allow-anonymous",
        action="store_true",
        help="let the gateways serve unsigned requests (no --gateway-credentials)",
    )
    p.add_argument(
        "--gateway-writable",
        action="append",
        default=[],
        metavar="DATASET",
        help="accept writes through the gateways to DATASET (repeatable)",
    )
    p.add_argument(
        "--file-root",
        action="append",
        default=[],
        metavar="DIR",
        help="allow file:// mounts under DIR (repeatable; default: the system temp directory)",
    )
    add_json(p)
    p.set_defaults(handler=cmd_up)

    p = sub.add_parser("down", help="stop the local cluster")
    p.add_argument(
        "--dir", type=Path, default=None, help="cluster directory (default ~/.shoal/cluster)"
    )
    p.set_defaults(handler=cmd_down)

    p = sub.add_parser("master", help="run a master in the foreground")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=19999, help="port (default 19999; 0: any free)")
    p.add_argument("--state-dir", default=".shoal/master", help="directory of the SQLite state")
    p.add_argument(
        "--heartbeat-interval",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds between worker heartbeats (default 2)",
    )
    p.add_argument(
        "--worker-expiry",
        type=float,
        default=10.0,
        metavar="S",
        help="a worker silent this long leaves the ring (default 10)",
    )
    p.add_argument(
        "--file-root",
        action="append",
        default=[],
        metavar="DIR",
        help="allow file:// mounts under DIR (repeatable; default: none, file:// refused)",
    )
    p.add_argument("--url-file", default=None, help="write the URL here once listening")
    p.add_argument(
        "--secret-file",
        default=None,
        metavar="FILE",
        help="the cluster secret (mode 600): require tokens signed with it (default: open API)",
    )
    p.add_argument(
        "--tls-cert", default=None, metavar="FILE", help="serve https: certificate (PEM)"
    )
    p.add_argument("--tls-key", default=None, metavar="FILE", help="its private key (PEM)")
    p.add_argument(
        "--standby",
        action="store_true",
        help="if another master serves --state-dir (shared storage), wait and take over "
        "when it stops (default: refuse to start)",
    )
    p.add_argument("--log-level", default="info", help="debug, info, warning or error")
    p.set_defaults(handler=cmd_master)
    master_admin.register(p)

    p = sub.add_parser("worker", help="run a worker in the foreground")
    p.add_argument("--master", required=False, help="master URL (default $SHOAL_MASTER)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=29999, help="port (default 29999; 0: any free)")
    p.add_argument("--advertise-host", default="", help="address other hosts use")
    p.add_argument("--dir", default=".shoal/worker", help="working directory")
    p.add_argument(
        "--tier",
        action="append",
        default=[],
        metavar="NAME:PATH:SIZE",
        help="cache tier, fastest first, e.g. mem:/dev/shm/shoal:1GiB ssd:/cache:100GiB",
    )
    p.add_argument("--uds", default="", help="Unix socket path (default DIR/worker.sock)")
    p.add_argument("--node", default=None, help="node identity (default $SHOAL_NODE or hostname)")
    p.add_argument(
        "--ufs-concurrency",
        type=int,
        default=32,
        metavar="N",
        help="concurrent under-storage requests (default 32)",
    )
    p.add_argument("--url-file", default=None, help="write host:port here once listening")
    p.add_argument(
        "--secret-file",
        default=None,
        metavar="FILE",
        help="the cluster secret (mode 600): clients' tokens are checked with it "
        "(default $SHOAL_SECRET; a worker of a cluster with auth needs one)",
    )
    p.add_argument(
        "--no-auth",
        action="store_true",
        help="serve the data path without checking tokens (anyone who reaches the ports reads)",
    )
    p.add_argument(
        "--tls-cert", default=None, metavar="FILE", help="TLS certificate (PEM) for the TCP port"
    )
    p.add_argument("--tls-key", default=None, metavar="FILE", help="its private key (PEM)")
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="on SIGTERM, first hand the cached files to their next owners, for at most "
        "SECONDS (default 0: stop at once; a second SIGTERM stops at once too)",
    )
    p.add_argument("--log-level", default="info", help="debug, info, warning or error")
    p.set_defaults(handler=cmd_worker)
    worker_admin.register(p)


def cmd_up(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise InvalidArgument("--workers must be at least 1")
    if not 0 <= args.drain_timeout < float("inf"):
        raise InvalidArgument(f"--drain-timeout must be >= 0 seconds, got {args.drain_timeout:g}")
    parse_size(args.mem)
    parse_size(args.disk)
    d: Path = (args.dir or default_dir()).resolve()
    state = load_state(d)
    if state is not None:
        raise InvalidArgument(
            f"a cluster is already running from {d} at {state['master']}; `shoal down` first"
        )
    roots = tuple(_roots(args.file_root)) or (tempfile.gettempdir(),)
    gateways = {
        kind: port
        for kind, port in (("s3", args.s3_gateway), ("webhdfs", args.webhdfs_gateway))
        if port is not None
    }
    gateway_args = _gateway_args(args) if gateways else []
    cluster = LocalCluster(
        d,
        workers=args.workers,
        mem=args.mem,
        disk=args.disk,
        host=args.host,
        file_roots=roots,
        auth=not args.no_auth,
        drain_timeout=args.drain_timeout,
        tls=args.tls,
        gateways=gateways,
        gateway_args=gateway_args,
    )
    try:
        url = cluster.start()
    except ShoalError:
        cluster.stop()
        raise
    ca = str(cluster.tls_ca) if cluster.tls_ca else None
    if cluster.auth or ca:
        token = cluster.admin_token_file.read_text().strip() if cluster.auth else None
        save_credentials(url, token, ca)
    if args.json:
        out = {"master": url, "dir": str(d), "pids": cluster.pids, "gateways": cluster.gateway_urls}
        emit_json({**out, **({"tls_ca": ca} if ca else {})})
    else:
        print(url)
        for kind, gw in cluster.gateway_urls.items():
            print(f"{kind} gateway: {gw}")
        if ca:  # this user's CLI and clients find it; others (or another SHOAL_HOME): this
            print(f"TLS CA: {ca} (for other users and hosts: SHOAL_TLS_CA={ca})")
    return 0


def _gateway_args(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    if args.gateway_credentials:
        out += ["--credentials", os.path.abspath(args.gateway_credentials)]
    elif args.gateway_allow_anonymous:
        out.append("--allow-anonymous")
    else:
        raise InvalidArgument(
            "a gateway needs --gateway-credentials FILE (access keys, see docs/gateway-auth.md) "
            "or --gateway-allow-anonymous"
        )
    for ds in args.gateway_writable:
        out += ["--writable", ds]
    return out


def cmd_down(args: argparse.Namespace) -> int:
    d: Path = (args.dir or default_dir()).resolve()
    state = load_state(d)
    names = down(d)
    if state is not None:
        forget_credentials(str(state["master"]))
    print(f"stopped {', '.join(names)}")
    return 0


def cmd_master(args: argparse.Namespace) -> int:
    from shoal.cli.main import setup_server_logging
    from shoal.master.server import run_master

    setup_server_logging(args.log_level)
    run_master(
        MasterSettings(
            host=args.host,
            port=args.port,
            state_dir=args.state_dir,
            heartbeat_interval=args.heartbeat_interval,
            worker_expiry=args.worker_expiry,
            url_file=args.url_file,
            file_roots=tuple(_roots(args.file_root)),
            secret_file=args.secret_file,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            standby=args.standby,
        )
    )
    return 0


def _roots(dirs: list[str]) -> list[str]:
    out = []
    for d in dirs:
        if not d or "\x00" in d or not os.path.isabs(d):
            raise InvalidArgument(f"--file-root {d!r}: give an absolute directory")
        out.append(os.path.realpath(d))
    return out


def cmd_worker(args: argparse.Namespace) -> int:
    from shoal.cli.main import setup_server_logging
    from shoal.worker.main import run_worker

    if not args.tier:
        raise InvalidArgument("a worker needs at least one --tier NAME:PATH:SIZE")
    setup_server_logging(args.log_level)
    run_worker(
        WorkerSettings(
            master=master_from_env(args.master, hint="pass --master URL"),
            host=args.host,
            port=args.port,
            work_dir=args.dir,
            tiers=tuple(TierSpec.parse(t) for t in args.tier),
            uds=args.uds,
            node=args.node or node_name(),
            advertise_host=args.advertise_host,
            ufs_concurrency=args.ufs_concurrency,
            url_file=args.url_file,
            secret_file=args.secret_file,
            no_auth=args.no_auth,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            drain_timeout=args.drain_timeout,
        )
    )
    return 0

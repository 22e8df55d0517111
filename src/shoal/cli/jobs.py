"""``shoal load|free|sync`` and ``shoal job ls|status|stop|resume``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from shoal.cli.common import client
from shoal.cli.output import add_json, add_master, emit_json, human_bytes, table
from shoal.client import Client
from shoal.core.jobs import FINAL, JobSpec
from shoal.core.types import split_path
from shoal.errors import InvalidArgument


def register(sub: Any) -> None:
    p = sub.add_parser("load", help="preload files into the cache (a batched, resumable job)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="/<dataset>[/<mount>[/<path>]]")
    p.add_argument("--metadata-only", action="store_true", help="only build the manifest")
    p.add_argument(
        "--files-from",
        metavar="LIST",
        type=Path,
        help="a file naming one /<dataset>/<mount>/<path> per line",
    )
    p.add_argument(
        "--glob",
        metavar="PATTERN",
        help="only paths (inside the dataset, '<mount>/<path>') matching this pattern",
    )
    p.add_argument("--replicas", type=int, default=None, help="copies to load (default: policy)")
    p.add_argument("--verify", action="store_true", help="check every page after loading")
    p.add_argument("--schedule", metavar="CRON", help="run periodically, e.g. '0 3 * * *'")
    _common(p)
    p.set_defaults(handler=cmd_job, kind="load")

    for kind, text in (
        ("free", "drop cached data under paths"),
        ("sync", "revalidate paths against under storage; drop stale versions"),
    ):
        p = sub.add_parser(kind, help=text)
        p.add_argument("paths", nargs="+", metavar="PATH")
        p.add_argument("--schedule", metavar="CRON", help="run periodically")
        _common(p)
        p.set_defaults(
            handler=cmd_job,
            kind=kind,
            metadata_only=False,
            files_from=None,
            glob=None,
            replicas=None,
            verify=False,
        )

    job = sub.add_parser("job", help="list and control jobs and schedules")
    jsub = job.add_subparsers(dest="job_command", metavar="ACTION", required=True)
    p = jsub.add_parser("ls", help="jobs and schedules")
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_ls)
    for action, text in (
        ("status", "show one job"),
        ("stop", "stop a job or disable a schedule"),
        ("resume", "resume a job or enable a schedule"),
    ):
        p = jsub.add_parser(action, help=text)
        p.add_argument("id")
        p.add_argument("--wait", action="store_true", help="follow the job until it ends")
        add_master(p)
        add_json(p)
        p.set_defaults(handler=cmd_control, action=action)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait", action="store_true", help="follow the job until it ends")
    add_master(p)
    add_json(p)


def build_spec(args: argparse.Namespace) -> JobSpec:
    nps = [split_path(p) for p in args.paths]
    datasets = {n.dataset for n in nps}
    files: tuple[str, ...] | None = None
    if args.files_from is not None:
        try:
            lines = args.files_from.read_text().splitlines()
        except OSError as exc:
            raise InvalidArgument(
                f"cannot read --files-from {args.files_from}: {exc.strerror}"
            ) from None
        named = [split_path(line.strip()) for line in lines if line.strip()]
        if not named:
            raise InvalidArgument(f"--files-from {args.files_from} names no files")
        datasets |= {n.dataset for n in named}
        files = tuple(n.key_path for n in named)
    if len(datasets) != 1:
        raise InvalidArgument(f"one job covers one dataset; got {', '.join(sorted(datasets))}")
    paths = tuple(n.key_path for n in nps)
    return JobSpec(
        kind=args.kind,
        dataset=datasets.pop(),
        paths=paths,
        glob=args.glob,
        files=files,
        metadata_only=args.metadata_only,
        replicas=args.replicas,
        verify=args.verify,
    )


def cmd_job(args: argparse.Namespace) -> int:
    spec = build_spec(args)
    with client(args) as c:
        view = c.submit_job(spec.to_dict(), args.schedule)
        if args.schedule or not args.wait:
            if args.json:
                emit_json(view)
            elif args.schedule:
                print(
                    f"schedule {view['id']}: {spec.kind} of /{spec.dataset} at "
                    f"{args.schedule!r}; next run {time.ctime(view['next_run'])}"
                )
            else:
                print(
                    f"job {view['id']} {view['state']}: follow it with "
                    f"`shoal job status {view['id']} --wait`"
                )
            return 0
        return _follow(c, view["id"], args.json)


def _follow(c: Client, job_id: str, as_json: bool) -> int:
    view = c.job(job_id)
    if as_json or not sys.stderr.isatty():
        while view["state"] not in (*FINAL, "stopped"):
            time.sleep(0.3)
            view = c.job(job_id)
    else:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TransferSpeedColumn,
        )

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TextColumn("{task.fields[files]}"),
            TimeElapsedColumn(),
            transient=False,
        ) as bar:
            t = bar.add_task(f"{view['kind']} {job_id}", total=None, files="")
            while True:
                done = view["files_done"] + view["files_skipped"] + view["files_failed"]
                bar.update(
                    t,
                    completed=view["bytes_done"],
                    total=view["bytes_total"] or None,
                    files=f"{done}/{view['files_total']} files"
                    f" ({view['files_skipped']} cached, {view['files_failed']} failed)"
                    f" [{view['state']}]",
                )
                if view["state"] in (*FINAL, "stopped"):
                    break
                time.sleep(0.3)
                view = c.job(job_id)
    if as_json:
        emit_json(view)
    else:
        _print_view(view)
    return 0 if view["state"] == "done" and not view["files_failed"] else 1


def _print_view(v: dict[str, Any]) -> None:
    print(
        f"job {v['id']} ({v['kind']} /{v['dataset']}): {v['state']}"
        + (f" - {v['error']}" if v.get("error") else "")
    )
    if v["kind"] != "schedule":
        print(
            f"  files: {v['files_done']} done, {v['files_skipped']} already cached, "
            f"{v['files_failed']} failed of {v['files_total']}; "
            f"{human_bytes(v['bytes_done'])} at {human_bytes(v['bytes_per_s'])}/s"
        )
        for path, why in v.get("failures", [])[:10]:
            print(f"  failed: {path}: {why}")


def cmd_ls(args: argparse.Namespace) -> int:
    with client(args) as c:
        data = c.jobs()
    if args.json:
        emit_json(data)
        return 0
    table(
        "jobs",
        ["id", "kind", "dataset", "state", "done", "cached", "failed", "bytes"],
        [
            (
                j["id"],
                j["kind"],
                j["dataset"],
                j["state"],
                j["files_done"],
                j["files_skipped"],
                j["files_failed"],
                human_bytes(j["bytes_done"]),
            )
            for j in data["jobs"]
        ],
    )
    table(
        "schedules",
        ["id", "cron", "job", "dataset", "state", "next run", "last job"],
        [
            (
                s["id"],
                s["cron"],
                s["spec"]["kind"],
                s["dataset"],
                s["state"],
                time.ctime(s["next_run"]),
                s["last_job"],
            )
            for s in data["schedules"]
        ],
    )
    return 0


def cmd_control(args: argparse.Namespace) -> int:
    with client(args) as c:
        if args.action == "stop":
            view = c.stop_job(args.id)
        elif args.action == "resume":
            view = c.resume_job(args.id)
        else:
            view = c.job(args.id)
        if args.wait and view.get("kind") != "schedule":
            return _follow(c, args.id, args.json)
    if args.json:
        emit_json(view)
    else:
        _print_view(view)
    return 0

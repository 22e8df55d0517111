"""``shoal load|free|sync`` and ``shoal job ls|status|stop|resume``."""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from pathlib import Path
from typing import Any

from tenacity import (
    before_sleep_log,
    retry,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from shoal.cli.common import client
from shoal.cli.output import add_json, add_master, emit_json, human_bytes, table
from shoal.client import Client
from shoal.core.jobs import ENDED, JobSpec
from shoal.core.types import split_path
from shoal.errors import InvalidArgument, ShoalError, Unavailable

log = logging.getLogger("shoal.cli.jobs")

#: how long ``--wait`` keeps asking a master that went away (a restarted master
#: resumes its jobs, so the wait goes on)
MASTER_GONE_S = 60.0
_JOB_ID = re.compile(r"[js]-[0-9a-f]{1,32}")


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
    p.add_argument(
        "--schedule",
        metavar="CRON",
        help="run periodically, e.g. '0 3 * * *' (5 fields, or 6 with seconds last)",
    )
    _common(p)
    p.set_defaults(handler=cmd_job, kind="load")

    for kind, text in (
        ("free", "drop cached data under paths"),
        ("sync", "revalidate paths against under storage; drop stale versions"),
    ):
        p = sub.add_parser(kind, help=text)
        p.add_argument("paths", nargs="+", metavar="PATH", help="/<dataset>[/<mount>[/<path>]]")
        p.add_argument("--schedule", metavar="CRON", help="run periodically, e.g. '0 3 * * *'")
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
        p.add_argument("id", help="a job id (j-...) or schedule id (s-...) from `shoal job ls`")
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


def _check_paths(c: Client, args: argparse.Namespace, spec: JobSpec) -> None:
    """Name a missing dataset or mount now, not in a job that fails later."""
    ds = c.dataset(spec.dataset)
    for p in [*args.paths, *(f"/{spec.dataset}/{f}" for f in spec.files or ())]:
        np = split_path(p)
        if np.mount:
            ds.mount(np.mount)


def cmd_job(args: argparse.Namespace) -> int:
    spec = build_spec(args)
    with client(args) as c:
        _check_paths(c, args, spec)
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


@retry(
    retry=retry_if_exception_type(Unavailable),
    stop=stop_after_delay(MASTER_GONE_S),
    wait=wait_exponential(multiplier=0.2, max=5.0),
    before_sleep=before_sleep_log(log, logging.DEBUG),
    reraise=True,
)
def _poll(c: Client, job_id: str) -> dict[str, Any]:
    """The job's view, asking again while the master is unreachable (a restart)."""
    return c.job(job_id)


def _files_text(v: dict[str, Any]) -> str:
    done = v["files_done"] + v["files_skipped"] + v["files_failed"]
    if v["kind"] == "free":
        return f"{v['files_done']} files freed [{v['state']}]"
    return (
        f"{done}/{v['files_total']} files ({v['files_skipped']} cached, "
        f"{v['files_failed']} failed) [{v['state']}]"
    )


def _follow(c: Client, job_id: str, as_json: bool) -> int:
    view = _poll(c, job_id)
    if as_json or not sys.stderr.isatty():
        while view["state"] not in ENDED:
            view = c.job(job_id, wait=10.0)  # answered when it ends
    else:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        # sizes and rates in the binary units of every other figure shoal prints
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[size]}"),
            TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[files]}"),
            TimeElapsedColumn(),
            transient=False,
        ) as bar:
            t = bar.add_task(f"{view['kind']} {job_id}", total=None, files="", size="", rate="")
            while True:
                total = view["bytes_total"] or None
                bar.update(
                    t,
                    completed=view["bytes_done"],
                    total=total,
                    size=human_bytes(view["bytes_done"])
                    + (f"/{human_bytes(total)}" if total else ""),
                    rate=f"{human_bytes(view.get('bytes_per_s') or 0)}/s",
                    files=_files_text(view),
                )
                if view["state"] in ENDED:
                    break
                time.sleep(0.3)
                view = _poll(c, job_id)
    if as_json:
        emit_json(view)
    else:
        _print_view(view, _mount_uris(c, view))
    return 0 if view["state"] == "done" and not view["files_failed"] else 1


def _mount_uris(c: Client, view: dict[str, Any]) -> dict[str, str]:
    """Mount name -> URI, to name the store in a listing failure (best effort)."""
    if not view.get("failures"):
        return {}
    try:
        return {m.name: m.uri for m in c.dataset(view["dataset"]).mounts}
    except ShoalError:
        return {}


def _where(v: dict[str, Any], path: str, uris: dict[str, str]) -> str:
    """A failure's place: a file path, or (empty path, bare mount) the listing of the
    mounts' stores, named by URI."""
    if path and "/" in path.strip("/"):
        return path
    mount = path.strip("/")
    named = [uris[mount]] if mount in uris else list(uris.values())
    what = f"/{v['dataset']}" + (f"/{mount}" if mount else "")
    return f"listing {what}" + (f" ({', '.join(named)})" if named else "")


def _print_view(v: dict[str, Any], uris: dict[str, str] | None = None) -> None:
    print(
        f"job {v['id']} ({v['kind']} /{v['dataset']}): {v['state']}"
        + (f" - {v['error']}" if v.get("error") else "")
    )
    if v["kind"] == "free":
        print(f"  files: {v['files_done']} freed, {v['files_failed']} failed")
    elif v["kind"] != "schedule":
        print(
            f"  files: {v['files_done']} done, {v['files_skipped']} already cached, "
            f"{v['files_failed']} failed of {v['files_total']}; "
            f"{human_bytes(v['bytes_done'])} at {human_bytes(v['bytes_per_s'])}/s"
        )
    for path, why in v.get("failures", [])[:10]:
        # an empty path is a failure of the job itself (e.g. listing the mount)
        where = _where(v, path, uris or {})
        print(f"  failed: {where}: {why or 'unknown error'}")


def cmd_ls(args: argparse.Namespace) -> int:
    with client(args) as c:
        data = c.jobs()
    # newest first: the job just started is the one people look for
    data["jobs"] = sorted(data.get("jobs", []), key=lambda j: j.get("created", 0), reverse=True)
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
    if not _JOB_ID.fullmatch(args.id):
        raise InvalidArgument(
            f"invalid job id {args.id!r}: ids look like j-1a2b3c4d5e (jobs) or "
            "s-1a2b3c4d5e (schedules); see `shoal job ls`"
        )
    with client(args) as c:
        if args.action == "stop":
            view = c.stop_job(args.id)
        elif args.action == "resume":
            view = c.resume_job(args.id)
        else:
            view = _poll(c, args.id) if args.wait else c.job(args.id)
        if args.wait and view.get("kind") != "schedule":
            return _follow(c, args.id, args.json)
    if args.json:
        emit_json(view)
    else:
        _print_view(view)
    return 0

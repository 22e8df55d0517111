"""``shoal fs ls|stat|cat|cp`` on namespace paths /<dataset>/<mount>/<path>."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from shoal.cli.common import client
from shoal.cli.output import add_json, add_master, emit_json, human_bytes, table
from shoal.core.types import FileInfo
from shoal.errors import InvalidArgument


def register(sub: Any) -> None:
    fs = sub.add_parser("fs", help="read files through the cache")
    fsub = fs.add_subparsers(dest="fs_command", metavar="ACTION", required=True)

    p = fsub.add_parser("ls", help="list a directory")
    p.add_argument("path", nargs="?", default="/")
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_ls)

    p = fsub.add_parser("stat", help="size, version and type of a path")
    p.add_argument("path")
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_stat)

    p = fsub.add_parser("cat", help="write a file to stdout")
    p.add_argument("path")
    add_master(p)
    p.set_defaults(handler=cmd_cat)

    p = fsub.add_parser("cp", help="copy a file (or, with -r, a directory) to a local path")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("-r", "--recursive", action="store_true")
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_cp)


def _info(i: FileInfo) -> dict[str, Any]:
    return {
        "path": i.path,
        "type": "directory" if i.is_dir else "file",
        "size": i.size,
        "version": i.version,
        "mtime": i.mtime,
    }


def cmd_ls(args: argparse.Namespace) -> int:
    with client(args) as c:
        entries = c.ls(args.path)
    if args.json:
        emit_json({"entries": [_info(e) for e in entries]})
    else:
        table(
            None,
            ["type", "size", "path"],
            [
                ("dir" if e.is_dir else "file", "" if e.is_dir else human_bytes(e.size), e.path)
                for e in entries
            ],
        )
    return 0


def cmd_stat(args: argparse.Namespace) -> int:
    with client(args) as c:
        info = c.stat(args.path)
    if args.json:
        emit_json(_info(info))
    else:
        for k, v in _info(info).items():
            print(f"{k:8} {v}")
    return 0


def cmd_cat(args: argparse.Namespace) -> int:
    with client(args) as c:
        data = c.read(args.path)
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0


def _write_atomic(dst: Path, data: bytes) -> None:
    """Write to a temp name beside the target, then rename: never a half-written file."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cmd_cp(args: argparse.Namespace) -> int:
    dst = Path(args.dst)
    copied = nbytes = 0
    with client(args) as c:
        info = c.stat(args.src)
        if info.is_dir:
            if not args.recursive:
                raise InvalidArgument(f"{args.src} is a directory: use -r")
            stack = [info.path]
            files: list[FileInfo] = []
            while stack:
                for e in c.ls(stack.pop()):
                    (stack.append(e.path) if e.is_dir else files.append(e))
            root = info.path.rstrip("/")
            for f in files:
                data = c.read(f.path)
                _write_atomic(dst / f.path[len(root) + 1 :], data)
                copied += 1
                nbytes += len(data)
        else:
            target = dst / Path(info.path).name if dst.is_dir() else dst
            data = c.read(info.path)
            _write_atomic(target, data)
            copied, nbytes = 1, len(data)
    if args.json:
        emit_json({"files": copied, "bytes": nbytes})
    else:
        print(f"copied {copied} file(s), {human_bytes(nbytes)}")
    return 0

"""``shoal fs ls|stat|cat|head|cp|find|du`` on namespace paths /<dataset>/<mount>/<path>.

Output bytes go through :func:`shoal.cli.output.write_all` (every byte or a one-line
error); local targets of ``cp`` through :mod:`shoal.cli.sink`.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shoal.cli.common import client
from shoal.cli.output import (
    add_json,
    add_master,
    emit_json,
    human_bytes,
    plain,
    table,
    write_all,
)
from shoal.cli.sink import local_target, make_dir, write_file
from shoal.client import Client
from shoal.core.types import FileInfo
from shoal.errors import InvalidArgument, IsADirectory

_STDOUT = 1
#: bytes per read when ``head`` looks for line ends
_HEAD_STEP = 64 * 1024


def register(sub: Any) -> None:
    fs = sub.add_parser("fs", help="read files through the cache")
    fsub = fs.add_subparsers(dest="fs_command", metavar="ACTION", required=True)

    p = fsub.add_parser("ls", help="list a directory")
    p.add_argument("path", nargs="?", default="/", help="/<dataset>[/<mount>[/<path>]]")
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_ls)

    p = fsub.add_parser("stat", help="size, version and type of a path")
    p.add_argument("path", help="/<dataset>/<mount>/<path>")
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_stat)

    p = fsub.add_parser("cat", help="write a file to stdout")
    p.add_argument("path", help="/<dataset>/<mount>/<path> of a file")
    add_master(p)
    p.set_defaults(handler=cmd_cat)

    p = fsub.add_parser("head", help="write the first lines (or bytes) of a file to stdout")
    p.add_argument("path", help="/<dataset>/<mount>/<path> of a file")
    g = p.add_mutually_exclusive_group()
    g.add_argument("-n", "--lines", type=int, default=10, help="lines to print (default 10)")
    g.add_argument("-c", "--bytes", type=int, default=None, help="bytes to print instead")
    add_master(p)
    p.set_defaults(handler=cmd_head)

    p = fsub.add_parser("cp", help="copy a file (or, with -r, a directory) to a local path")
    p.add_argument("src", help="/<dataset>/<mount>/<path>")
    p.add_argument(
        "dst",
        help="local file or directory; a character device or FIFO (e.g. /dev/stdout) "
        "is written into, never replaced",
    )
    p.add_argument("-r", "--recursive", action="store_true", help="copy a directory tree")
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_cp)

    p = fsub.add_parser("find", help="list every file under a path, recursively")
    p.add_argument("path", help="/<dataset>[/<mount>[/<path>]]")
    p.add_argument("--name", metavar="PATTERN", help="only files whose name matches (glob)")
    p.add_argument("--type", choices=("f", "d"), help="only files (f) or directories (d)")
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_find)

    p = fsub.add_parser("du", help="total size and file count under each path")
    p.add_argument("paths", nargs="+", metavar="PATH", help="/<dataset>[/<mount>[/<path>]]")
    p.add_argument("-b", "--bytes", action="store_true", help="sizes in bytes, not KiB/MiB")
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_du)


def _info(i: FileInfo) -> dict[str, Any]:
    return {
        "path": i.path,
        "type": "directory" if i.is_dir else "file",
        "size": i.size,
        "version": i.version,
        "mtime": i.mtime,
    }


def _dir_error(path: str) -> InvalidArgument:
    return InvalidArgument(
        f"{path} is a directory: list it with `shoal fs ls {path}` or copy it with `shoal fs cp -r`"
    )


def _file(c: Client, path: str) -> FileInfo:
    """The FileInfo of a file; a one-line error naming the fix for a directory."""
    info = c.stat(path)
    if info.is_dir:
        raise _dir_error(info.path)
    return info


def _read(c: Client, path: str, offset: int = 0, length: int = -1) -> bytes:
    try:
        return c.read(path, offset, length)
    except IsADirectory:
        raise _dir_error(path) from None


def walk(c: Client, root: FileInfo) -> Iterator[FileInfo]:
    """Every entry under the directory ``root`` (depth first, directories included)."""
    stack = [root.path]
    while stack:
        for e in sorted(c.ls(stack.pop()), key=lambda e: e.path, reverse=True):
            yield e
            if e.is_dir:
                stack.append(e.path)


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
            print(f"{k}\t{v}" if plain() else f"{k:8} {v}")
    return 0


def cmd_cat(args: argparse.Namespace) -> int:
    with client(args) as c:
        info = _file(c, args.path)
        data = _read(c, info.path)
    sys.stdout.flush()  # nothing buffered may land after the bytes
    write_all(_STDOUT, data, f"fs cat {info.path}")
    return 0


def cmd_head(args: argparse.Namespace) -> int:
    if (args.bytes is not None and args.bytes < 0) or args.lines < 0:
        raise InvalidArgument("fs head: -n and -c take a count >= 0")
    with client(args) as c:
        info = _file(c, args.path)
        if args.bytes is not None:
            out = _read(c, info.path, 0, min(args.bytes, info.size)) if args.bytes else b""
        else:
            buf = bytearray()
            while buf.count(b"\n") < args.lines and len(buf) < info.size:
                buf += _read(c, info.path, len(buf), min(_HEAD_STEP, info.size - len(buf)))
            end = 0
            for _ in range(args.lines):
                nl = buf.find(b"\n", end)
                if nl < 0:
                    end = len(buf)
                    break
                end = nl + 1
            out = bytes(buf[:end])
    sys.stdout.flush()
    write_all(_STDOUT, out, f"fs head {info.path}")
    return 0


def cmd_cp(args: argparse.Namespace) -> int:
    dst = Path(args.dst)
    copied = nbytes = 0
    with client(args) as c:
        info = c.stat(args.src)
        if info.is_dir:
            if not args.recursive:
                raise InvalidArgument(f"{info.path} is a directory: use -r")
            root = info.path.rstrip("/")
            files = [e for e in walk(c, info) if not e.is_dir]
            make_dir(dst)
            for f in files:
                data = _read(c, f.path)
                write_file(local_target(dst / f.path[len(root) + 1 :]), data)
                copied += 1
                nbytes += len(data)
        else:
            target = local_target(dst, name=Path(info.path).name)
            data = _read(c, info.path)
            write_file(target, data)
            copied, nbytes = 1, len(data)
    if args.json:
        emit_json({"files": copied, "bytes": nbytes})
    else:
        print(f"copied {copied} file(s), {human_bytes(nbytes)}")
    return 0


def cmd_find(args: argparse.Namespace) -> int:
    with client(args) as c:
        top = c.stat(args.path)
        found = sorted(walk(c, top), key=lambda e: e.path) if top.is_dir else [top]
    if args.type:
        found = [e for e in found if e.is_dir == (args.type == "d")]
    if args.name:
        found = [e for e in found if fnmatch.fnmatchcase(e.path.rsplit("/", 1)[-1], args.name)]
    if args.json:
        emit_json({"entries": [_info(e) for e in found]})
    else:
        for e in found:
            print(e.path)
    return 0


def cmd_du(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    with client(args) as c:
        for path in args.paths:
            top = c.stat(path)
            files = [e for e in walk(c, top) if not e.is_dir] if top.is_dir else [top]
            rows.append(
                {"path": top.path, "files": len(files), "bytes": sum(e.size for e in files)}
            )
    if args.json:
        emit_json({"entries": rows})
    else:
        table(
            None,
            ["size", "files", "path"],
            [
                (r["bytes"] if args.bytes else human_bytes(r["bytes"]), r["files"], r["path"])
                for r in rows
            ],
        )
    return 0

"""Bytes the CLI writes arrive whole or the command fails (issue 11 item 1, issue 10
item 4): a slow pipe reader gets every byte, a full device or a closed pipe gives one
error line and a non-zero status, and ``fs cp`` never replaces a device node."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shoal.client import Client
from shoal.core.types import Mount
from shoal.testing.cli import assert_one_line_error, cli_env, run_cli
from shoal.testing.cluster import TestCluster

pytestmark = pytest.mark.integration

SIZE = 6 * 1024 * 1024 + 12345


@dataclass(frozen=True)
class Src:
    env: dict[str, str]
    data: bytes
    path: str = "/out/m/big.bin"


@pytest.fixture(scope="module")
def src(module_cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Src]:
    d = tmp_path_factory.mktemp("outsrc")
    data = os.urandom(SIZE)
    (d / "big.bin").write_bytes(data)
    (d / "lines.txt").write_bytes(b"".join(b"line %d\n" % i for i in range(100)))
    with Client(module_cluster.master_url) as c:
        c.create_dataset("out", [Mount("m", f"file://{d}")])
    # PYTHONUNBUFFERED=1, the default of many ML images, made one write(2) per call
    yield Src(cli_env(module_cluster.master_url, PYTHONUNBUFFERED="1"), data)


def _cat(src: Src, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "shoal", "fs", "cat", src.path, *args],
        env=src.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_cat_into_a_slow_pipe_writes_every_byte(src: Src) -> None:
    p = _cat(src)
    assert p.stdout is not None and p.stderr is not None
    # a slow reader: the pipe (64 KiB) fills long before the reader starts
    first = p.stdout.read(1)
    time.sleep(1.0)
    rest = p.stdout.read()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0, err
    got = first + rest
    assert len(got) == SIZE and hashlib.sha256(got).digest() == hashlib.sha256(src.data).digest()


def test_cat_into_a_closed_pipe_fails_loudly(src: Src) -> None:
    p = _cat(src)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.read(10)
    p.stdout.close()  # the reader goes away, as `| head -c 10` does
    code = p.wait(timeout=60)
    r = subprocess.CompletedProcess(p.args, code, "", p.stderr.read().decode())
    assert_one_line_error(r, 1, "closed the pipe", f"of {SIZE:,} bytes")


def test_cat_to_a_full_device_fails(src: Src) -> None:
    with open("/dev/full", "wb") as full:
        r = subprocess.run(
            [sys.executable, "-m", "shoal", "fs", "cat", src.path],
            env=src.env,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert_one_line_error(r, 1, "No space left on device")


def _full_device(tmp_path: Path) -> Path:
    """A node of the full device: our own where we may create one (as root), so a
    regression replaces that and not the system's /dev/full; else /dev/full, which a
    user who is not root cannot replace."""
    node = tmp_path / "full"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 7))
        return node
    except OSError:
        return Path("/dev/full")


def test_cp_to_a_device_writes_into_it_and_keeps_it(src: Src, tmp_path: Path) -> None:
    full = _full_device(tmp_path)
    before = os.stat(full)
    r = run_cli("fs", "cp", src.path, str(full), env=src.env)
    assert_one_line_error(r, 1, str(full), "No space left on device")
    after = os.stat(full)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    assert after.st_ino == before.st_ino
    # a character device the user means to write into is written into, every byte
    r = run_cli("fs", "cp", src.path, "/dev/null", env=src.env)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_cp_into_a_fifo(src: Src, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = bytearray()

    def drain() -> None:
        with open(fifo, "rb") as f:
            got.extend(f.read())

    t = threading.Thread(target=drain)
    t.start()
    r = run_cli("fs", "cp", src.path, str(fifo), env=src.env)
    t.join(timeout=60)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and bytes(got) == src.data


def test_cp_regular_file_replaced_whole_and_refusals(src: Src, tmp_path: Path) -> None:
    target = tmp_path / "copy.bin"
    target.write_bytes(b"old")
    target.chmod(0o640)
    r = run_cli("fs", "cp", src.path, str(target), env=src.env)
    assert r.returncode == 0, r.stderr
    assert target.read_bytes() == src.data and stat.S_IMODE(target.stat().st_mode) == 0o640
    # through a symlink: the file it points to is replaced, the link stays
    link = tmp_path / "link"
    link.symlink_to(target)
    target.write_bytes(b"old")
    assert run_cli("fs", "cp", src.path, str(link), env=src.env).returncode == 0
    assert link.is_symlink() and target.read_bytes() == src.data
    # a socket is neither a file nor a stream to write into
    import socket

    sock_path = tmp_path / "s.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock_path))
    try:
        r = run_cli("fs", "cp", src.path, str(sock_path), env=src.env)
        assert_one_line_error(r, 2, "refusing", "socket")
        assert stat.S_ISSOCK(os.stat(sock_path).st_mode)
    finally:
        s.close()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


def test_cp_onto_a_full_tmpfs_leaves_nothing(src: Src, tmp_path: Path) -> None:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        (mnt / "keep.bin").write_bytes(b"keep")
        r2 = run_cli("fs", "cp", src.path, str(mnt / "keep.bin"), env=src.env)
        assert_one_line_error(r2, 1, "No space left on device")
        # the old file is whole and no temp file is left behind
        assert (mnt / "keep.bin").read_bytes() == b"keep"
        assert sorted(p.name for p in mnt.iterdir()) == ["keep.bin"]
        with open(mnt / "out.bin", "wb") as out:
            r3 = subprocess.run(
                [sys.executable, "-m", "shoal", "fs", "cat", src.path],
                env=src.env,
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
            )
        assert_one_line_error(r3, 1, "No space left on device")
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_head(src: Src) -> None:
    r = run_cli("fs", "head", "/out/m/lines.txt", env=src.env)
    assert r.returncode == 0 and r.stdout == "".join(f"line {i}\n" for i in range(10))
    r = run_cli("fs", "head", "-n", "3", "/out/m/lines.txt", env=src.env)
    assert r.stdout == "line 0\nline 1\nline 2\n"
    r = subprocess.run(
        [sys.executable, "-m", "shoal", "fs", "head", "-c", "100", src.path],
        env=src.env,
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout == src.data[:100]

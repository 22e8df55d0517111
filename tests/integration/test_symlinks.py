"""file:// sources: exact nanosecond mtimes end to end (client, manifest, mount), and
symbolic links that leave the mount root refused by every interface."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.core.types import Mount
from shoal.errors import ShoalError
from shoal.testing.cluster import TestCluster
from shoal.testing.fuse import can_mount, mounted

pytestmark = pytest.mark.integration

MTIME_NS = 1_700_000_000_123_456_789  # sub-microsecond digits a float would lose
SECRET = b"outside the root: never served"


def shoal(cluster: TestCluster, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, SHOAL_MASTER=cluster.master_url, **cluster.env)
    return subprocess.run(
        [sys.executable, "-m", "shoal", *args], env=env, capture_output=True, timeout=120
    )


def source(tmp: Path) -> Path:
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET)
    root = tmp / "src"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"hello")
    os.utime(root / "a.txt", ns=(MTIME_NS, MTIME_NS))
    (root / "sub" / "b.txt").write_bytes(b"bee")
    os.symlink("a.txt", root / "link.txt")  # inside: followed
    os.symlink(root / "sub", root / "subdir")  # absolute, but inside: followed
    os.symlink("/", root / "slash")  # leaves the root
    os.symlink(outside / "secret.txt", root / "secret.txt")  # leaves the root
    os.symlink("../outside", root / "up")  # leaves the root, relative
    os.symlink("nowhere", root / "broken")
    return root


INSIDE = ["a.txt", "link.txt", "sub", "subdir"]
ESCAPING = ["secret.txt", "slash/etc/hostname", "up/secret.txt", "slash", "up"]


def test_mtimes_are_exact_and_escaping_links_refused(cluster: TestCluster, tmp_path: Path) -> None:
    root = source(tmp_path)
    with cluster.client() as c:
        c.create_dataset("loc", [Mount("m", f"file://{root}")])
        c.create_dataset("raw", [Mount("m", f"file://{root}")])  # never loaded
        assert sorted(e.path.rsplit("/", 1)[1] for e in c.ls("/loc/m")) == INSIDE
        assert c.stat("/loc/m/a.txt").mtime_ns == MTIME_NS
        assert c.stat("/loc/m/link.txt").mtime_ns == MTIME_NS  # the target's
        assert c.read("/loc/m/link.txt") == b"hello"
        assert c.read("/loc/m/subdir/b.txt") == b"bee"
        for rel in ESCAPING:
            with pytest.raises(ShoalError):
                c.read(f"/loc/m/{rel}")
            with pytest.raises(ShoalError):
                c.stat(f"/loc/m/{rel}")
    r = shoal(cluster, "fs", "cat", "/loc/m/secret.txt")
    assert r.returncode != 0 and SECRET not in r.stdout
    # a load puts the entries into the manifest: the nanoseconds survive it
    r = shoal(cluster, "load", "/loc", "--wait")
    assert r.returncode == 0, r.stderr
    with cluster.client() as c:
        assert c.dataset("loc").manifest
        assert c.stat("/loc/m/a.txt").mtime_ns == MTIME_NS
        print(sorted(e.path.rsplit("/", 1)[1] for e in c.ls("/loc/m")))
    if not can_mount():
        return
    with mounted(cluster.master_url, tmp_path / "fuse") as mnt:
        d = mnt.path / "loc" / "m"
        print(sorted(os.listdir(d)))
        check_links(d)
        for rel in ESCAPING:
            with pytest.raises(OSError):
                (d / rel).read_bytes()
        # no manifest: metadata from worker answers (reads first, so the client holds
        # located files without mtimes) still shows the source's mtime
        raw = mnt.path / "raw" / "m"
        assert (raw / "sub" / "b.txt").read_bytes() == b"bee"
        assert (raw / "link.txt").read_bytes() == b"hello"
        assert sorted(os.listdir(raw)) == INSIDE
        check_links(raw)
        assert (raw / "subdir" / "b.txt").read_bytes() == b"bee"  # a linked directory


def check_links(d: Path) -> None:
    """Inside the mount: a link to a file inside the root is a link the kernel follows."""
    for name in ("a.txt", "link.txt"):
        assert os.stat(d / name).st_mtime_ns == MTIME_NS, name
        assert (d / name).read_bytes() == b"hello"
    assert stat.S_ISLNK(os.lstat(d / "link.txt").st_mode)
    assert os.readlink(d / "link.txt") == "a.txt"
    assert os.lstat(d / "link.txt").st_size == len("a.txt")
    assert not stat.S_ISLNK(os.lstat(d / "a.txt").st_mode)
    with pytest.raises(OSError) as e:
        os.readlink(d / "a.txt")
    assert e.value.errno == errno.EINVAL
    kinds = {e.name: (e.is_symlink(), e.is_dir()) for e in os.scandir(d)}
    assert kinds["link.txt"] == (True, False) and kinds["a.txt"] == (False, False)


def test_local_store_keeps_links_inside_the_root(tmp_path: Path) -> None:
    """The driver alone (what workers and the client's fallback read through)."""
    import asyncio

    from shoal.errors import PermissionDenied
    from shoal.ufs.local import LocalStore

    root = source(tmp_path)
    store = LocalStore(str(root))

    async def run() -> None:
        listed = {i.path: i for i in await store.ls("")}
        assert sorted(listed) == INSIDE
        assert listed["link.txt"].link == "a.txt" and listed["a.txt"].link == ""
        assert listed["link.txt"].mtime_ns == MTIME_NS and listed["link.txt"].size == 5
        assert listed["subdir"].is_dir and listed["subdir"].link == ""
        info = await store.info("link.txt")
        assert info.link == "a.txt" and info.version == listed["a.txt"].version
        assert (await store.info("sub/b.txt")).link == ""
        assert await store.read("link.txt", 0, 5) == b"hello"
        walked = sorted([i.path async for i in store.walk("")])
        assert all(not p.startswith(("slash", "up", "secret")) for p in walked), walked
        for rel in ESCAPING:
            with pytest.raises(PermissionDenied):
                await store.info(rel)
            with pytest.raises(PermissionDenied):
                await store.read(rel, 0, 10)
        with pytest.raises(PermissionDenied):
            await store.ls("slash")

    asyncio.run(run())

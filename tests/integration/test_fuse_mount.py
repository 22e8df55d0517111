"""The POSIX mount for real: a daemon started the way `shoal mount` starts it, over a
cluster of real processes, read with plain open()/os calls and checked by hash."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import pytest

from shoal.core.types import Mount
from shoal.fuse import kernel
from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.fuse import Mounted, can_mount, mount_cli, mounted
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not can_mount(), reason="needs /dev/fuse and root"),
]

MiB = 1 << 20


def h(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# -- one cluster and one mount for the read-only checks ---------------------------------


@dataclass
class World:
    cluster: TestCluster
    files: dict[str, bytes]  # relative path under /ds/data -> bytes
    listing: list[str]  # names in the large local directory (/local/dir)
    mnt: Mounted


@pytest.fixture(scope="module")
def world(
    moto: MotoServer, s3_credentials: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    base = tmp_path_factory.mktemp("fuse")
    files = sample_files(300, 1, 200_000, seed=11)
    files["big/large.bin"] = random.Random(12).randbytes(9 * MiB + 4321)
    files["empty.bin"] = b""
    make_bucket(moto.endpoint, "fuse-world", files)
    local = base / "local"
    names = [f"e{i:06d}.txt" for i in range(20_000)]
    (local / "dir").mkdir(parents=True)
    for n in names:
        (local / "dir" / n).write_bytes(n.encode())
    cluster = start_cluster(base / "cluster", workers=2)
    try:
        with cluster.client() as c:
            c.create_dataset(
                "ds", [Mount("data", "s3://fuse-world", {"endpoint_url": moto.endpoint})]
            )
            c.create_dataset("local", [Mount("dir", f"file://{local / 'dir'}")])
        with mounted(cluster.master_url, base, watchdog_s=300) as m:
            yield World(cluster, files, names, m)
    finally:
        cluster.stop()


def test_reads_are_byte_exact(world: World) -> None:
    root = world.mnt.path
    assert sorted(os.listdir(root)) == ["ds", "local"]
    assert os.listdir(root / "ds") == ["data"]
    for rel, data in world.files.items():
        p = root / "ds" / "data" / rel
        assert os.stat(p).st_size == len(data), rel
        with open(p, "rb") as f:
            assert h(f.read()) == h(data), rel
    assert sorted(os.listdir(root / "ds/data/big")) == ["large.bin"]
    assert os.path.isdir(root / "ds/data/000")
    # a second pass (kernel page cache and the daemon's warm paths) is still exact
    for rel, data in world.files.items():
        assert (root / "ds" / "data" / rel).read_bytes() == data


def test_random_offsets_and_sizes(world: World) -> None:
    rng = random.Random(5)
    root = world.mnt.path / "ds" / "data"
    for rel in ["big/large.bin", *rng.sample(sorted(world.files), 20)]:
        data = world.files[rel]
        fd = os.open(root / rel, os.O_RDONLY)
        try:
            for _ in range(30):
                off = rng.randrange(0, len(data) + 10)
                n = rng.randrange(0, 3 * MiB)
                assert os.pread(fd, n, off) == data[off : off + n], (rel, off, n)
        finally:
            os.close(fd)


def test_large_file_by_passthrough(world: World) -> None:
    m = world.mnt
    p = m.path / "ds/data/big/large.bin"
    want = h(world.files["big/large.bin"])
    assert h(p.read_bytes()) == want  # first full read: the local worker now holds it whole
    if not m.state["passthrough"]:
        pytest.skip("the kernel did not grant FUSE passthrough")
    reads = m.requests("READ")
    first = m.metrics()
    before = first['shoal_fuse_opens_total{mode="passthrough"}']
    for i in range(3):
        if i == 1:  # the backing file stays registered between opens of one version
            calls = m.metrics()["shoal_fuse_client_calls_total"]
            assert m.metrics()["shoal_fuse_backing_files"] == 1
        with open(p, "rb", buffering=0) as f:
            got = hashlib.sha256()
            while chunk := f.read(MiB):
                got.update(chunk)
        assert got.hexdigest() == want
    after = m.metrics()
    assert after['shoal_fuse_opens_total{mode="passthrough"}'] >= before + 3
    assert after["shoal_fuse_client_calls_total"] == calls  # later opens ask the worker nothing
    assert m.requests("READ") == reads  # not one READ reached the daemon


def test_a_directory_of_large_files_is_handed_over_in_one_ask(world: World, tmp_path: Path) -> None:
    """The first open of each cached large file takes its data file's descriptor from
    its directory's answer: one ask of the local workers for the directory, not one
    round trip per file; every byte the kernel then reads by passthrough is exact."""
    src = tmp_path / "src" / "shards"
    src.mkdir(parents=True)
    rng = random.Random(21)
    data = {f"s{i}.bin": rng.randbytes(2 * MiB + i * 4099) for i in range(6)}
    for name, b in data.items():
        (src / name).write_bytes(b)
    (src / "small.txt").write_bytes(b"tiny")
    with world.cluster.client() as c:
        c.create_dataset("shards", [Mount("s", (tmp_path / "src").as_uri())])
        for name, b in data.items():
            assert c.cat(f"/shards/s/shards/{name}") == b
            got = c.open_local(f"/shards/s/shards/{name}", load=False)
            assert got is not None  # kept whole on its worker
            os.close(got[0])
    with mounted(world.cluster.master_url, tmp_path / "m", "--dataset", "shards") as m:
        if not m.state["passthrough"]:
            pytest.skip("the kernel did not grant FUSE passthrough")
        d = m.path / "shards/s/shards"
        for name in data:
            os.stat(d / name)
        calls = m.metrics()["shoal_fuse_client_calls_total"]
        for name, b in data.items():
            assert (d / name).read_bytes() == b, name
        after = m.metrics()
        assert after['shoal_fuse_opens_total{mode="passthrough"}'] == len(data)
        assert after["shoal_fuse_client_calls_total"] == calls + 1
        assert (d / "small.txt").read_bytes() == b"tiny"
        # a second pass reuses the registrations: no ask at all
        for name, b in data.items():
            assert (d / name).read_bytes() == b, name
        assert m.metrics()["shoal_fuse_client_calls_total"] <= calls + 2


def test_large_directory(world: World) -> None:
    d = world.mnt.path / "local/dir"
    t = time.monotonic()
    names = os.listdir(d)
    assert sorted(names) == world.listing
    with os.scandir(d) as it:
        entries = {e.name: e for e in it}
    assert len(entries) == len(world.listing)
    for n in random.Random(1).sample(world.listing, 50):
        assert entries[n].is_file() and entries[n].stat().st_size == len(n)
        assert (d / n).read_bytes() == n.encode()
    assert time.monotonic() - t < 30


def test_missing_paths_are_enoent(world: World) -> None:
    root = world.mnt.path
    for p in ("ds/data/nope.bin", "ds/nomount/x", "nodataset", "ds/data/000/missing"):
        with pytest.raises(FileNotFoundError):
            os.stat(root / p)
        with pytest.raises(FileNotFoundError):
            os.open(root / p, os.O_RDONLY)


@pytest.mark.parametrize(
    "call",
    [
        lambda p, d: os.open(p, os.O_WRONLY),
        lambda p, d: os.open(p, os.O_WRONLY | os.O_APPEND),
        lambda p, d: os.open(p, os.O_RDWR),
        lambda p, d: os.open(p, os.O_RDONLY | os.O_TRUNC),
        lambda p, d: os.open(d / "new.bin", os.O_CREAT | os.O_WRONLY, 0o644),
        lambda p, d: os.truncate(p, 0),
        lambda p, d: os.mkdir(d / "newdir"),
        lambda p, d: os.rmdir(d / "000"),
        lambda p, d: os.unlink(p),
        lambda p, d: os.rename(p, d / "renamed.bin"),
        lambda p, d: os.chmod(p, 0o777),
        lambda p, d: os.utime(p, (0, 0)),
        lambda p, d: os.symlink("x", d / "link"),
        lambda p, d: os.link(p, d / "hard"),
        lambda p, d: os.setxattr(p, "user.k", b"v"),
        lambda p, d: os.removexattr(p, "user.k"),
    ],
    ids=lambda f: "",
)
def test_every_write_is_erofs(world: World, call) -> None:
    d = world.mnt.path / "ds/data"
    p = d / "empty.bin"
    with pytest.raises(OSError) as e:
        call(p, d)
    assert e.value.errno == errno.EROFS


def _hash_files(paths: list[str]) -> dict[str, str]:
    out = {}
    for p in paths:
        with open(p, "rb") as f:
            out[p] = h(f.read())
    return out


def test_processes_read_in_shuffled_order(world: World) -> None:
    root = world.mnt.path / "ds" / "data"
    rels = sorted(world.files)
    jobs = []
    for seed in range(4):
        order = rels[:]
        random.Random(seed).shuffle(order)
        jobs.append([str(root / r) for r in order])
    with ProcessPoolExecutor(4, mp_context=get_context("fork")) as ex:
        for got in ex.map(_hash_files, jobs):
            for p, digest in got.items():
                assert digest == h(world.files[os.path.relpath(p, root)])


def test_kernel_open_mode(world: World, tmp_path: Path) -> None:
    """--kernel-open: opens never reach the daemon, reads stay exact."""
    with mounted(world.cluster.master_url, tmp_path, "--kernel-open") as m:
        rels = sorted(world.files)[:50]
        for _ in range(2):
            for rel in rels:
                assert (m.path / "ds/data" / rel).read_bytes() == world.files[rel]
        assert m.requests("OPEN") <= 1  # answered ENOSYS once, then never sent again
        assert m.requests("RELEASE") == 0


# -- failures: their own cluster --------------------------------------------------------


def test_worker_killed_during_reads(
    moto: MotoServer, cluster: TestCluster, bucket: str, tmp_path: Path
) -> None:
    files = sample_files(400, 1000, 60_000, seed=21)
    make_bucket(moto.endpoint, bucket, files)
    with cluster.client() as c:
        c.create_dataset("ds", [Mount("data", f"s3://{bucket}", {"endpoint_url": moto.endpoint})])
    errors: list[str] = []
    with mounted(cluster.master_url, tmp_path) as m:
        root = m.path / "ds" / "data"
        order = sorted(files)
        random.Random(3).shuffle(order)
        done = threading.Event()

        def reader(part: list[str]) -> None:
            for rel in part:
                try:
                    if (root / rel).read_bytes() != files[rel]:
                        errors.append(f"{rel}: wrong bytes")
                except OSError as exc:
                    errors.append(f"{rel}: {exc}")

        threads = [threading.Thread(target=reader, args=(order[i::3],)) for i in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        cluster.kill_worker(0)
        for t in threads:
            t.join(timeout=120)
        done.set()
    assert not errors, errors[:5]


def test_umount_after_sigterm_and_after_crash(cluster: TestCluster, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_bytes(b"hello")
    with cluster.client() as c:
        c.create_dataset("ds", [Mount("m", f"file://{src}")])
    # SIGTERM: the daemon unmounts itself
    with mounted(cluster.master_url, tmp_path / "t") as m:
        assert (m.path / "ds/m/a.txt").read_bytes() == b"hello"
        os.kill(m.state["pid"], signal.SIGTERM)
        deadline = time.monotonic() + 10
        while kernel.is_mounted(str(m.path)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not kernel.is_mounted(str(m.path))
    # SIGKILL: the mount point is dead until `shoal umount` clears it
    with mounted(cluster.master_url, tmp_path / "k") as m:
        pid = m.state["pid"]
        assert (m.path / "ds/m/a.txt").read_bytes() == b"hello"
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        with pytest.raises(OSError) as e:
            os.listdir(m.path)
        assert e.value.errno == errno.ENOTCONN
        r = mount_cli("umount", str(m.path), "--state-dir", str(m.state_dir))
        assert r.returncode == 0, r.stderr
        assert not kernel.is_mounted(str(m.path))
        assert os.listdir(m.path) == []
        # and it mounts again on the same point
        r = mount_cli("mount", str(m.path), "--master", cluster.master_url,
                 "--state-dir", str(m.state_dir))  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert (m.path / "ds/m/a.txt").read_bytes() == b"hello"
        assert json.dumps(m.state)

"""Every read is accounted once in ``shoal report``, whatever served it (short circuit,
local socket, TCP, batch, fsspec, a front-end's own local reads), and clients leave no
"Unclosed client session" noise at exit, DataLoader workers included."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import fsspec
import pytest

from shoal.testing.cluster import TestCluster, sample_files
from shoal.testing.reports import wait_dataset
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration

N = 24
PASSES = 3


def _seed(moto: MotoServer, cluster: TestCluster, bucket: str, name: str) -> dict[str, bytes]:
    files = sample_files(N, 1000, 40_000, seed=len(name))
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint, name=name)
    return {f"/{name}/data/{k}": v for k, v in files.items()}


def _report(cluster: TestCluster, name: str, reads: int) -> dict[str, Any]:
    """The dataset's report once it counts ``reads`` reads (hits + misses)."""
    return wait_dataset(cluster, name, lambda d: d["hits"] + d["misses"] >= reads, timeout=20)


def _check(d: dict[str, Any], files: dict[str, bytes], local: bool) -> None:
    total = sum(len(v) for v in files.values())
    assert (d["misses"], d["hits"]) == (N, N * (PASSES - 1)), d
    src = d["bytes_by_source"]
    assert src["ufs"] == total, d
    served = (src["local"], src["remote"])
    assert served == ((total * (PASSES - 1), 0) if local else (0, total * (PASSES - 1))), d
    assert d["hit_ratio"] == pytest.approx((PASSES - 1) / PASSES), d


def test_short_circuit_reads_are_accounted(
    moto: MotoServer, module_cluster: TestCluster, bucket: str
) -> None:
    files = _seed(moto, module_cluster, bucket, "acc-read")
    with module_cluster.client() as c:
        for _ in range(PASSES):
            for p, v in files.items():
                assert c.read(p) == v
        assert c.counters()["short_circuit"] >= N  # most warm reads were a pread here
        # reported in batches, by time too: no close, no 4096 reads needed
        _check(_report(module_cluster, "acc-read", N * PASSES), files, local=True)


def test_tcp_and_batched_reads_are_accounted(
    moto: MotoServer, module_cluster: TestCluster, bucket: str
) -> None:
    files = _seed(moto, module_cluster, bucket, "acc-batch")
    with module_cluster.client(short_circuit=False) as c:
        for _ in range(PASSES):
            got = c.cat_many(list(files))
            assert got == files
    _check(_report(module_cluster, "acc-batch", N * PASSES), files, local=False)


def test_fsspec_reads_are_accounted(
    moto: MotoServer, module_cluster: TestCluster, bucket: str
) -> None:
    files = _seed(moto, module_cluster, bucket, "acc-fsspec")
    fs = fsspec.filesystem("shoal", master=module_cluster.master_url, skip_instance_cache=True)
    for _ in range(PASSES):
        for p, v in files.items():
            assert fs.cat_file(p.lstrip("/")) == v
    _check(_report(module_cluster, "acc-fsspec", N * PASSES), files, local=True)


def test_a_fresh_fsspec_reader_of_cached_files_needs_no_async_client(
    moto: MotoServer, module_cluster: TestCluster, bucket: str
) -> None:
    """A new process's first reads through fsspec are the sync client's blocking ones
    (shoal.fsspec_file): byte-exact, whole and ranged, with no AsyncClient built, and
    still reported to the worker as hits."""
    files = _seed(moto, module_cluster, bucket, "acc-fresh")
    with module_cluster.client() as c:
        assert c.cat_many(list(files)) == files  # cached: N misses
    fs = fsspec.filesystem("shoal", master=module_cluster.master_url, skip_instance_cache=True)
    try:
        for p, v in files.items():
            assert fs.cat_file(p.lstrip("/")) == v
            assert fs.cat_file(p, 100, 900) == v[100:900]
        assert fs._conn.aio is None  # served on this thread, no loop was needed
        d = _report(module_cluster, "acc-fresh", 3 * N)
    finally:
        fs.close()
    assert (d["misses"], d["hits"]) == (N, 2 * N), d
    assert d["bytes_by_source"]["local"] == sum(len(v) + 800 for v in files.values()), d


def test_a_fresh_reader_opens_and_stats_a_cached_file_without_an_async_client(
    moto: MotoServer, module_cluster: TestCluster, bucket: str
) -> None:
    """``open`` asks for the file's size first: in a new process that stat is the
    blocking STAT of the local owner (shoal.client.direct), as is the sync client's
    before it has a loop, with the answers the async path gives; a missing file leaves
    that path on, and is still FileNotFoundError. A second miss in a directory goes to
    the async path, which lists the directory once for the stats that follow."""
    files = _seed(moto, module_cluster, bucket, "acc-open")
    with module_cluster.client() as c:
        assert c.cat_many(list(files)) == files
        want = {p: c.stat(p) for p in files}  # the async path's answers
    first, v = next(iter(files.items()))
    fs = fsspec.filesystem("shoal", master=module_cluster.master_url, skip_instance_cache=True)
    fresh = module_cluster.client()
    try:
        with fs.open(first.lstrip("/")) as f:
            assert f.size == len(v)
            f.seek(-10, 2)
            assert f.read() == v[-10:]
            f.seek(0)
            assert f.read() == v
        got, w = fs.info(first), want[first]
        assert (got["size"], got["version"], got["mtime"]) == (w.size, w.version, w.mtime)
        info = fresh.stat(first)
        assert (info.path, info.size, info.version, info.mtime) == (
            first,
            w.size,
            w.version,
            w.mtime,
        )
        direct = fs._conn.direct(fs.settings, fs.client_cache)
        assert direct is not None and direct.stat("/acc-open/data/no-such-file") is None
        assert not direct.off
        assert fs._conn.aio is None and fresh._loop is None  # no loop was needed
        with pytest.raises(FileNotFoundError):
            fs.info("acc-open/data/no-such-file")  # the async path answers it
        for p, v in files.items():  # the rest, whichever path serves them
            with fs.open(p.lstrip("/")) as f:
                assert f.read() == v
            assert fresh.stat(p).version == want[p].version
    finally:
        fs.close()
        fresh.close()


def test_note_local_read_counts_a_local_hit(
    moto: MotoServer, module_cluster: TestCluster, bucket: str
) -> None:
    files = _seed(moto, module_cluster, bucket, "acc-note")
    path = next(iter(files))
    with module_cluster.client() as c:
        assert c.read(path) == files[path]  # one miss
        for _ in range(5):  # what a FUSE passthrough read would report
            c.aio.note_local_read(path, 1000)
        c.aio.note_local_read("/no-such-dataset/data/x", 10)  # ignored, no error
        d = _report(module_cluster, "acc-note", 6)
    assert (d["misses"], d["hits"]) == (1, 5), d
    assert d["bytes_by_source"]["local"] == 5000, d


# -- 11.9: no "Unclosed client session" at exit ------------------------------------------

_DATALOADER = textwrap.dedent(
    """
    import sys

    from torch.utils.data import DataLoader

    from shoal.torch import ShoalMapDataset, ShoalSampler

    ds = ShoalMapDataset(sys.argv[1], master=sys.argv[2], prefetch=8)
    sampler = ShoalSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, collate_fn=list)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        assert sum(len(b) for b in loader) == len(ds)
    print("ok", len(ds))
    """
)


def test_dataloader_processes_exit_without_unclosed_session_noise(
    moto: MotoServer, module_cluster: TestCluster, bucket: str, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    _seed(moto, module_cluster, bucket, "acc-dl")
    script = tmp_path / "loader.py"
    script.write_text(_DATALOADER)
    r = subprocess.run(
        [sys.executable, str(script), "/acc-dl/data", module_cluster.master_url],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONWARNINGS="default", **module_cluster.env),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"ok {N}", r.stdout
    assert "Unclosed" not in r.stderr, r.stderr
    assert "destroyed but it is pending" not in r.stderr, r.stderr


def test_a_client_left_open_exits_quietly(module_cluster: TestCluster, tmp_path: Path) -> None:
    script = tmp_path / "open.py"
    script.write_text(
        "import sys\nfrom shoal.client import Client\n"
        "c = Client(sys.argv[1])\nprint(len(c.datasets()))\n"
    )
    _runs_quietly(script, module_cluster.master_url)


def test_a_forked_child_that_never_uses_its_inherited_client_exits_quietly(
    module_cluster: TestCluster, tmp_path: Path
) -> None:
    """A DataLoader worker (or any fork) of a process holding a client inherits the
    client's HTTP session; the child must not print aiohttp's "Unclosed client session"
    when it drops the client without ever using it (seen from the benchmark's training
    loop: its DataLoader workers dropped the harness's clients)."""
    script = tmp_path / "fork.py"
    script.write_text(
        "import gc, multiprocessing as mp, sys\nfrom shoal.client import Client\n"
        "c = Client(sys.argv[1])\nprint(len(c.datasets()))\n"
        "def child():\n    global c\n    del c\n    gc.collect()\n"
        "p = mp.get_context('fork').Process(target=child)\np.start()\np.join()\n"
        "sys.exit(p.exitcode)\n"
    )
    _runs_quietly(script, module_cluster.master_url)


def _runs_quietly(script: Path, master: str) -> None:
    r = subprocess.run(
        [sys.executable, str(script), master],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONWARNINGS="default"),
    )
    assert r.returncode == 0, r.stderr
    assert "Unclosed" not in r.stderr, r.stderr

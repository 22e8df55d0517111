"""The attacks of issue 10 (items 12-16) against real processes, each refused: a live
worker id registered by an impostor, anonymous DROP frames of good pages, file://
datasets outside the master's roots and symlinks out of a file:// source, the modes of
the worker's socket and cache files, partial huge frames and thousands of idle
connections.

The cluster has no authentication yet (that is the cluster issue); these probes hold
without it. The raw-frame helpers are tests/integration/test_wire_hardening.py's and
the symlinked source tree is tests/integration/test_symlinks.py's (imported, not
copied)."""

from __future__ import annotations

import json
import os
import secrets
import selectors
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from relhelpers import (
    Dataset,
    Figures,
    fd_count,
    integration_module,
    load,
    rss_bytes,
    seed,
    wait_for,
    worker_info,
    worker_pid,
)

from shoal.core.types import Mount
from shoal.errors import DatasetNotFound, ShoalError
from shoal.proto import wire
from shoal.proto.control import RING, WORKER_REGISTER
from shoal.proto.wire import Op
from shoal.testing.cli import http, master_state
from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.s3 import MotoServer

pytestmark = pytest.mark.integration

wh = integration_module("test_wire_hardening")
links = integration_module("test_symlinks")

MiB = 1 << 20
FD_SLACK = 32


@pytest.fixture(scope="module")
def attacked(
    tmp_path_factory: pytest.TempPathFactory, s3_credentials: None, moto: MotoServer
) -> Iterator[tuple[TestCluster, Dataset]]:
    """Two workers (default wire limits), a dataset both hold whole (replicas=2), loaded."""
    c = start_cluster(tmp_path_factory.mktemp("attacks"), workers=2, mem="0")
    try:
        files = sample_files(16, 1000, 200_000, seed=101)
        files["big/large.bin"] = os.urandom(3 * MiB + 5)  # several pages
        ds = seed(moto, c, "attack-bucket", files, options={"replicas": "2"})
        state = load(c)
        assert state["state"] == "done", state
        yield c, ds
    finally:
        c.stop()


def _ring(c: TestCluster) -> list[dict[str, Any]]:
    status, ring = http(c.master_url, "GET", RING, None)
    assert status == 200
    workers: list[dict[str, Any]] = ring["workers"]
    return workers


def _read_all(c: TestCluster, ds: Dataset, **settings: Any) -> int:
    """Wrong or failed reads of every file of ``ds`` by a new client."""
    bad = 0
    with c.client(**settings) as cl:
        for k, v in ds.files.items():
            try:
                bad += cl.read(ds.path(k)) != v
            except ShoalError:
                bad += 1
    return bad


def _knows(c: TestCluster, path: str) -> bool:
    with c.client() as cl:
        try:
            cl.ls(path)
        except DatasetNotFound:
            return False
    return True


# -- item 13: a worker id is bound to its key ----------------------------------------


def test_an_impostor_cannot_take_over_a_live_worker_id(
    attacked: tuple[TestCluster, Dataset], figures: Figures
) -> None:
    c, ds = attacked
    real = worker_info(c, 0)
    # where an impostor would serve injected bytes: counts whoever connects
    trap = socket.socket()
    trap.bind(("127.0.0.1", 0))
    trap.listen(64)
    trap.setblocking(False)
    body = {"id": real["id"], "host": "127.0.0.1", "port": trap.getsockname()[1], "uds": ""}
    keys: dict[str, str | None] = {
        "another key": secrets.token_hex(32),
        "no key": None,
        "the other worker's key": (c.worker_dir(1) / "key").read_text().strip(),
    }
    refused = 0
    answers = []
    try:
        for what, key in keys.items():
            b = {**body, **({"key": key} if key is not None else {})}
            status, answer = http(c.master_url, "POST", WORKER_REGISTER, json.dumps(b).encode())
            message = (answer or {}).get("error", {}).get("message", "")
            answers.append((what, status, message))
            refused += status == 403 and "another key" in message
        ring = _ring(c)
        at_real = [w["port"] for w in ring if w["id"] == real["id"]]
        # a new client then reads only what the real workers serve
        bad = _read_all(c, ds, short_circuit=False)
        try:
            trap.accept()[0].close()
            trapped = 1
        except BlockingIOError:
            trapped = 0
    finally:
        trap.close()
    figures.record(
        "re-registrations of a live worker id at another address (another key, no key, "
        "another worker's key)",
        len(keys),
        "403 each; the ring keeps the real address; new clients read correct bytes",
        len(keys) - refused + int(at_real != [real["port"]]) + bad + trapped,
    )
    assert refused == len(keys), answers
    assert at_real == [real["port"]], ring
    assert all(w["port"] != body["port"] for w in ring)
    assert bad == 0 and trapped == 0


# -- item 14: anonymous DROP frames -------------------------------------------------------


def test_anonymous_drops_of_good_pages_drop_nothing(
    attacked: tuple[TestCluster, Dataset], figures: Figures
) -> None:
    c, ds = attacked
    addrs = wh._addrs(c)
    corrupt0 = wh._metric(c, "shoal_corrupt_pages_total")
    gets0 = wh._metric(c, "shoal_ufs_requests_total")
    located: dict[str, tuple[list[Any], str]] = {}
    for k in sorted(ds.files):
        pages, fds, meta = wh._locate(str(addrs["unix"]), f"data/{k}")
        for fd in fds:
            os.close(fd)
        located[k] = (pages, meta["v"])
    drops = 0
    for k, (pages, version) in located.items():
        for index in range(len(pages)):
            for addr in (addrs["tcp"], addrs["unix"]):
                wh._drop(addr, f"data/{k}", version, index)
                drops += 1
    # every page is still where it was, nothing was fetched again, nothing counted corrupt
    moved = 0
    for k, (pages, _) in located.items():
        again, fds, _meta = wh._locate(str(addrs["unix"]), f"data/{k}")
        for fd in fds:
            os.close(fd)
        moved += again != pages
    corrupt = wh._metric(c, "shoal_corrupt_pages_total") - corrupt0
    bad = _read_all(c, ds, short_circuit=True) + _read_all(c, ds, short_circuit=False)
    gets = wh._metric(c, "shoal_ufs_requests_total") - gets0
    figures.record(
        "anonymous DROP frames of good pages (TCP and the Unix socket)",
        drops,
        "no page dropped or refetched; corrupt-page counter stays 0",
        moved + int(corrupt) + int(gets) + bad,
        files=len(located),
        refetches=int(gets),
    )
    assert moved == 0 and bad == 0
    assert corrupt == 0, corrupt
    assert gets == 0, f"{gets} store requests after DROPs of good pages"


# -- item 15: file:// mounts -------------------------------------------------------------


def test_file_mounts_outside_the_roots_are_refused(
    attacked: tuple[TestCluster, Dataset], tmp_path: Path, figures: Figures
) -> None:
    c, _ = attacked
    to_etc = tmp_path / "etc-link"
    to_etc.symlink_to("/etc")
    uris = {
        "outside the roots": "file:///etc",
        "the shadow file": "file:///etc/shadow",
        "'..' out of a root": f"file://{tmp_path}" + "/.." * len(tmp_path.parts) + "/etc",
        "a symlink in a root to /etc": f"file://{to_etc}",
        "the filesystem root": "file:///",
        "local:// spelling": "local:///etc",
    }
    before = master_state(c.master_url)
    refused = 0
    answers = []
    for i, uri in enumerate(uris.values()):
        body = {"name": f"evil{i}", "mounts": [{"name": "m", "uri": uri}]}
        status, answer = http(c.master_url, "POST", "/api/v1/datasets", json.dumps(body).encode())
        answers.append((uri, status, answer))
        refused += status == 400
    changed = master_state(c.master_url) != before
    figures.record(
        "file:// datasets outside the master's roots (/etc, /etc/shadow, '..', a symlink "
        "to /etc, /, local://)",
        len(uris),
        "400 each, no dataset created",
        len(uris) - refused + int(changed),
    )
    assert refused == len(uris), answers
    assert not changed


def test_symlinks_out_of_a_file_source_are_neither_listed_nor_read(
    attacked: tuple[TestCluster, Dataset], tmp_path: Path, figures: Figures
) -> None:
    c, _ = attacked
    root = links.source(tmp_path)
    with c.client() as cl:
        cl.create_dataset("linked", [Mount("m", f"file://{root}")])
    # in this module the first ls right after create_dataset got DatasetNotFound from a
    # worker (a finding, reported in RELIABILITY.md; not what this probe is about): wait
    # until the workers know the dataset
    wait_for(lambda: _knows(c, "/linked/m"), 15, "the workers to know the dataset")
    probes = leaked = 0
    listings = []
    try:
        for sc in (True, False):
            with c.client(short_circuit=sc) as cl:
                listings.append(sorted(e.path.rsplit("/", 1)[1] for e in cl.ls("/linked/m")))
                probes += 1
                for rel in links.ESCAPING:
                    for op in (cl.read, cl.stat):
                        probes += 1
                        try:
                            got = op(f"/linked/m/{rel}")
                        except ShoalError:
                            continue
                        leaked += 1
                        assert not isinstance(got, bytes) or links.SECRET not in got
                assert cl.read("/linked/m/link.txt") == b"hello"  # a link inside: followed
    finally:
        with c.client() as cl:
            cl.delete_dataset("linked")
    wrong_listing = sum(ls != links.INSIDE for ls in listings)
    figures.record(
        "symlinks leaving a file:// source (to /, to a file outside, '../'): listed, read, "
        "stat (short circuit and TCP clients)",
        probes,
        "never listed, every read and stat refused",
        leaked + wrong_listing,
    )
    assert wrong_listing == 0, listings
    assert leaked == 0


# -- item 16: private socket and cache files --------------------------------------------


def test_the_socket_and_cache_files_are_private(
    attacked: tuple[TestCluster, Dataset], figures: Figures
) -> None:
    c, _ = attacked
    checked = public = 0
    found = []
    for i in range(c.workers):
        st = os.stat(worker_info(c, i)["uds"])
        checked += 1
        if not stat.S_ISSOCK(st.st_mode) or stat.S_IMODE(st.st_mode) != 0o660:
            public += 1
            found.append(("socket", oct(st.st_mode)))
        key = c.worker_dir(i) / "key"
        for dirpath, dirs, names in [
            *os.walk(c.worker_dir(i) / "cache"),
            (str(key.parent), [], [key.name]),
        ]:
            for n in [*names, *dirs]:
                p = Path(dirpath, n)
                mode = stat.S_IMODE(p.stat().st_mode)
                checked += 1
                if mode & 0o077:
                    public += 1
                    found.append((str(p), oct(mode)))
    figures.record(
        "modes of the workers' Unix sockets, identity keys and cache files and directories",
        checked,
        "socket 0660; every key and cache file and directory without group/other bits",
        public,
    )
    assert checked > 10
    assert public == 0, found[:5]


# -- item 12: partial huge frames, idle connections ------------------------------------


def test_partial_64_mib_frames_hold_no_memory(
    attacked: tuple[TestCluster, Dataset], figures: Figures
) -> None:
    c, _ = attacked
    addrs = wh._addrs(c)
    pid = worker_pid(c, 0)
    rss0, fds0 = rss_bytes(pid), fd_count(pid)
    chunk = b"\0" * MiB
    conns = []
    sent = 0
    try:
        for _ in range(16):
            s = wh._connect(addrs["tcp"], 5.0)
            conns.append(s)
            try:
                s.sendall(wire.REQ_HDR.pack(64 * MiB, Op.BATCH, 1))
                for _ in range(16):  # 16 MiB of each frame, or until the worker refuses
                    s.sendall(chunk)
                    sent += 1
            except OSError:
                pass
        wh._hello(addrs["unix"])
        grown = rss_bytes(pid) - rss0
    finally:
        for s in conns:
            s.close()
    # back to its baseline (some slack: the worker's own pools to the master, the store
    # and the other worker come and go), not thousands of leaked descriptors
    wait_for(lambda: fd_count(pid) <= fds0 + FD_SLACK, 20, "the worker to release the connections")
    figures.record(
        "16 connections each sending a frame that claims 64 MiB",
        16,
        "worker answers; RSS +<32 MiB; fds back to baseline",
        int(grown >= 32 * MiB),
        rss_growth_mib=round(grown / MiB, 1),
        mib_sent=sent,
    )
    assert grown < 32 * MiB, grown / MiB


IDLE = 3000


def test_thousands_of_idle_connections_leave_others_served(
    attacked: tuple[TestCluster, Dataset], figures: Figures
) -> None:
    """3,000 idle connections from one peer: the worker keeps at most its per-peer cap
    (wire.CONNS_PER_PEER, two descriptors each), and another peer is still served."""
    c, _ = attacked
    info = worker_info(c, 0)
    pid = worker_pid(c, 0)
    rss0, fds0 = rss_bytes(pid), fd_count(pid)
    conns: list[socket.socket] = []
    t0 = time.monotonic()
    try:
        # non-blocking connects, awaited together: what the accept queue drops is
        # retried by the kernel in parallel instead of one connection after another
        sel = selectors.DefaultSelector()
        for _ in range(IDLE):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex((info["host"], int(info["port"])))
            sel.register(s, selectors.EVENT_WRITE)
            conns.append(s)
        pending = len(conns)
        deadline = time.monotonic() + 30
        while pending and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=1.0):
                sel.unregister(key.fileobj)
                pending -= 1
        sel.close()
        not_connected = pending
        connect_s = time.monotonic() - t0
        # another peer (another loopback source address) is served meanwhile
        other = socket.socket()
        other.settimeout(5.0)
        try:
            other.bind(("127.0.0.2", 0))
            other.connect((info["host"], int(info["port"])))
            other.sendall(wire.encode_request(Op.HELLO, 7, [wire.VERSION]))
            status, req, _meta = wh._reply(other)
            served = status == wire.Status.OK and req == 7
        finally:
            other.close()
        wh._hello(info["uds"])
        peak_fds = fd_count(pid)
        grown = rss_bytes(pid) - rss0
    finally:
        for s in conns:
            s.close()
    t1 = time.monotonic()
    try:
        # 3,000 connections must not leave 3,000 fds; a few dozen more than the baseline
        # were seen under a loaded CI run (pools to the master and store): allow 128
        wait_for(lambda: fd_count(pid) <= fds0 + 128, 30, "the connections released")
    except AssertionError:
        raise AssertionError(f"worker fds {fd_count(pid)}, baseline {fds0}") from None
    release_s = time.monotonic() - t1
    bound = fds0 + 2 * wire.CONNS_PER_PEER + 64
    figures.record(
        f"{IDLE:,} idle TCP connections from one peer",
        IDLE,
        "worker fds within 2 x its per-peer cap; RSS +<64 MiB; another peer served",
        int(peak_fds > bound) + int(grown >= 64 * MiB) + int(not served),
        peak_fds=peak_fds,
        baseline_fds=fds0,
        rss_growth_mib=round(grown / MiB, 1),
        connect_s=round(connect_s, 1),
        not_yet_connected=not_connected,
        release_s=round(release_s, 1),
    )
    assert served
    assert peak_fds <= bound, (peak_fds, fds0)
    assert grown < 64 * MiB, grown / MiB

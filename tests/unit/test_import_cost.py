"""What a new process pays before its first byte: every DataLoader worker, pandas script
and CLI call is one. ``import shoal.client`` and ``Client(...)`` in an open cluster load
no HTTP library, no JWT or crypto library and no server code, the client's record
classes generate no code at import (shoal.core.records), and a fresh process's first
read of a cached file keeps it that way -- and imports no asyncio (nor uvloop) and
starts no event-loop thread either (shoal.client.direct), its hits still reported."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.core.records import record
from shoal.core.types import Mount
from shoal.testing.cluster import TestCluster, start_cluster
from shoal.testing.reports import wait_dataset

#: what a reader process never needs to import (tokens: only with a secret or token)
HEAVY = [
    *("aiohttp", "yarl", "jwt", "cryptography", "shoal.core.tokens", "fsspec", "botocore"),
    *("shoal.worker", "shoal.master", "shoal.store", "shoal.ufs", "shoal.cli"),
]
#: modules whose classes are records: importing them generates no dataclass code
RECORDS = (
    "shoal.proto.messages",
    "shoal.config",
    "shoal.client.cache",
    "shoal.proto.lighthttp",
    "shoal.proto.master_api",
)

_PROBE = """
import dataclasses, json, sys
made = []
orig = dataclasses._process_class
def counted(cls, *a, **k):
    made.append(cls.__module__)
    return orig(cls, *a, **k)
dataclasses._process_class = counted
from shoal.client import Client
{code}
heavy = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in {heavy!r}))
print(json.dumps({{"heavy": heavy, "made": made}}))
"""


def _probe(code: str, heavy: list[str] = HEAVY, **env: str) -> dict[str, list[str]]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    src = _PROBE.format(code=code, heavy=heavy)
    out = subprocess.run(
        [sys.executable, "-c", src],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    got: dict[str, list[str]] = json.loads(out.stdout.splitlines()[-1])
    return got


def test_a_new_client_imports_no_http_jwt_or_server_code(tmp_path: Path) -> None:
    got = _probe("Client('http://127.0.0.1:9')", SHOAL_HOME=str(tmp_path))
    assert got["heavy"] == []


def test_a_cluster_secret_still_mints_the_admin_token(tmp_path: Path) -> None:
    code = "assert Client('http://127.0.0.1:9').aio.api.token.count('.') == 2  # a JWT"
    got = _probe(code, SHOAL_HOME=str(tmp_path), SHOAL_SECRET=os.urandom(32).hex())
    assert "jwt" in got["heavy"]  # minted from the secret, as before


def test_the_client_records_generate_no_code_at_import(tmp_path: Path) -> None:
    got = _probe("", SHOAL_HOME=str(tmp_path))
    assert [m for m in got["made"] if m in RECORDS] == []


# -- the records themselves ---------------------------------------------------------------


@record
class Point:
    x: int
    y: int = 0
    tags: list[str] = dataclasses.field(default_factory=list)
    secret: str = dataclasses.field(default="", repr=False)


@record(slots=False)
class Checked:
    name: str
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError("negative size")
        object.__setattr__(self, "name", self.name.strip())


@record(slots=False, frozen=False)
class Tally:
    hits: int = 0
    seen: dict[str, int] = dataclasses.field(default_factory=dict)


def test_a_record_is_a_frozen_slotted_dataclass() -> None:
    p = Point(1, secret="s")
    assert (p.x, p.y, p.tags, p.secret) == (1, 0, [], "s")
    assert p == Point(1, 0, [], "s") and p != Point(2) and Point(1).tags is not Point(1).tags
    assert repr(p) == "Point(x=1, y=0, tags=[])"
    assert not hasattr(p, "__dict__") and Point.__match_args__ == ("x", "y", "tags", "secret")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 2  # type: ignore[misc]
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'x'"):
        Point()  # type: ignore[call-arg]
    assert [f.name for f in dataclasses.fields(p)] == ["x", "y", "tags", "secret"]
    assert dataclasses.is_dataclass(p) and dataclasses.asdict(Point(3))["x"] == 3
    assert dataclasses.replace(p, y=5) == Point(1, 5, [], "s")
    assert pickle.loads(pickle.dumps(p)) == p
    assert hash(Point(1, 2, None)) == hash(Point(1, 2, None))  # type: ignore[arg-type]
    match Point(4, 5):
        case Point(a, b):
            assert (a, b) == (4, 5)


def test_post_init_runs_and_unslotted_records_keep_dict_and_defaults() -> None:
    c = Checked("  a ")
    assert c.name == "a" and c.__dict__ == {"name": "a", "size": 1} and Checked.size == 1
    with pytest.raises(ValueError, match="negative"):
        Checked("b", -1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.size = 2  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(c)) == c
    t = Tally()
    t.hits += 1
    t.seen["x"] = 1
    assert t == Tally(1, {"x": 1}) and t.__dict__ == {"hits": 1, "seen": {"x": 1}}
    with pytest.raises(TypeError, match="unhashable"):
        hash(t)


def test_a_field_without_default_after_one_with_is_refused() -> None:
    with pytest.raises(TypeError, match="non-default field 'b' after defaults"):

        @record
        class Bad:
            a: int = 0
            b: int  # type: ignore[misc]


# -- a fresh process's first read ------------------------------------------------------------


@pytest.fixture
def cached(tmp_path: Path) -> Iterator[tuple[TestCluster, bytes]]:
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(100 << 10)
    (src / "f.bin").write_bytes(data)
    c = start_cluster(tmp_path / "c", workers=1, mem="0", disk="64MiB")
    try:
        with c.client() as cl:
            cl.create_dataset("ds", [Mount("m", f"file://{src}", {})], None)
            assert cl.read("ds/m/f.bin") == data  # cached on the worker now
        yield c, data
    finally:
        c.stop()


@pytest.mark.integration
def test_a_fresh_process_reads_a_cached_file_without_heavy_imports(
    cached: tuple[TestCluster, bytes], tmp_path: Path
) -> None:
    c, data = cached
    code = (
        f"cl = Client({c.master_url!r}); d = cl.read('ds/m/f.bin')\n"
        f"assert len(d) == {len(data)} and cl.counters()['short_circuit'] == 1, cl.counters()"
    )
    got = _probe(code, SHOAL_HOME=str(tmp_path))
    assert got["heavy"] == []


@pytest.mark.integration
def test_a_fresh_process_reads_a_cached_file_without_asyncio_or_a_loop_thread(
    cached: tuple[TestCluster, bytes], tmp_path: Path
) -> None:
    c, data = cached
    code = (
        "import threading\n"
        f"cl = Client({c.master_url!r}); d = cl.read('ds/m/f.bin')\n"
        f"assert len(d) == {len(data)} and d == open({str(tmp_path / 'src' / 'f.bin')!r}, 'rb').read()\n"
        "assert cl.read('ds/m/f.bin', 1000, 5000) == d[1000:6000]  # a warm pread\n"
        "assert cl.counters()['short_circuit'] == 2, cl.counters()\n"
        "assert 'shoal-client' not in [t.name for t in threading.enumerate()]\n"
    )
    got = _probe(
        code, ["asyncio", "uvloop", "shoal.client.aio", "aiohttp"], SHOAL_HOME=str(tmp_path)
    )
    assert got["heavy"] == []
    # both reads reach the report: the LOCATE counted by the worker, the pread by a TOUCH
    d = wait_dataset(c, "ds", lambda d: d["hits"] >= 2, timeout=20)
    assert (d["misses"], d["hits"]) == (1, 2), d

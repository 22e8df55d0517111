"""Which previous owners a new owner asks for a moved file, and what it accepts from
them: pure parts of shoal.worker.peers (the transfers themselves run between real
workers in tests/integration/test_elastic.py)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import xxhash

from shoal.core.ring import Ring
from shoal.core.types import CachePolicy, Dataset, Mount
from shoal.errors import ProtocolError
from shoal.proto.messages import ReadReply, ReadRequest, decode_request
from shoal.proto.wire import Op
from shoal.worker.peers import PeerView, _checked

DS = Dataset("ds", (Mount("data", "s3://b"),))
ADDRS = [{"id": w, "host": "10.0.0.1", "port": 7000 + i} for i, w in enumerate("abcd")]


def body(
    holders: dict[str, list[str]], peers: list[dict[str, object]] | None = None
) -> dict[str, object]:
    return {
        "epoch": 3,
        "vnodes": 128,
        "workers": ADDRS[:4] if peers is None else ADDRS[:3],
        "history": [{"epoch": 2, "age_s": 1.0, "workers": ["a", "b", "c"], "holders": holders}],
        "peers": peers or [],
    }


def moved_key() -> str:
    old, new = Ring.build(2, "abc"), Ring.build(3, "abcd")
    return next(
        p for i in range(1000) if old.owner(f"ds/{(p := f'data/{i}.bin')}") != new.owner(f"ds/{p}")
    )


def test_a_new_owner_asks_the_previous_owner_that_held_the_dataset() -> None:
    v = PeerView("d")
    v.update(body({"a": ["ds"], "b": ["ds"], "c": ["ds"]}))
    path = moved_key()
    old = Ring.build(2, "abc").owner(f"ds/{path}")
    assert [m for m, _ in v.candidates(DS, path)] == [old]
    # a previous owner that held nothing of this dataset is not asked
    v.update(body({m: ["other"] for m in "abc"}))
    assert v.candidates(DS, path) == []
    # nor for a dataset placed locally (its files live by their readers)
    local = Dataset("ds", DS.mounts, CachePolicy(placement="local"))
    v.update(body({m: ["ds"] for m in "abc"}))
    assert v.candidates(local, path) == []


def test_peers_are_reached_over_tls_exactly_when_they_registered_it() -> None:
    b = body({"a": ["ds"]})
    workers: Any = b["workers"]
    workers[0] = {**workers[0], "tls": True}
    workers[1] = {**workers[1], "tls": False}
    v = PeerView("d")
    v.update(b)
    assert v.tls == {("10.0.0.1", 7000): True, ("10.0.0.1", 7001): False}
    # a worker the ring says nothing of (an older master): as this worker's own port
    assert ("10.0.0.1", 7002) not in v.tls


def test_a_malformed_ring_answer_changes_nothing() -> None:
    v = PeerView("d")
    v.update(body({"a": ["ds"]}))
    before = (v.epoch, v.ring, v.past)
    v.update({"epoch": "x", "workers": [{"id": "a"}]})
    assert (v.epoch, v.ring, v.past) == before


def test_only_the_page_asked_for_with_good_checksums_is_taken() -> None:
    data = b"x" * 1000
    ck = xxhash.xxh3_64_intdigest(data)
    good = ReadReply("v1", 1000, 0.0, 0, [[1000, ck]])
    assert _checked(good, data, "v1", 0, 4096) == data
    assert _checked(good, data, None, 0, 4096) == data
    assert _checked(good, data, "v2", 0, 4096) is None  # another version
    assert _checked(good, b"y" * 1000, "v1", 0, 4096) is None  # bytes do not match
    assert _checked(ReadReply("v1", 1000, 0.0, 1, [[1000, ck]]), data, "v1", 0, 4096) is None
    assert _checked(ReadReply("v1", 5000, 0.0, 0, [[1000, ck]]), data, "v1", 0, 4096) is None


def test_a_peer_read_is_cached_only_and_older_reads_still_decode() -> None:
    old = msgpack.packb(["ds", "data/x", 0, -1, "v1", 4096, 3])  # a 7-field READ
    assert decode_request(Op.READ, old) == ReadRequest("ds", "data/x", 0, -1, "v1", 4096, 3)
    assert not decode_request(Op.READ, old).cached_only  # type: ignore[union-attr]
    req = ReadRequest("ds", "data/x", 0, 4096, None, 4096, cached_only=True)
    assert decode_request(Op.READ, msgpack.packb(req.encode())) == req
    with pytest.raises(ProtocolError, match="argument 7"):
        decode_request(Op.READ, msgpack.packb(["ds", "data/x", 0, -1, None, 0, None, 1]))

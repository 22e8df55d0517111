"""Membership state machine: plain calls with an explicit clock, no sockets, no sleeps."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shoal.core.membership import (
    EXPIRED,
    LIVE,
    EpochBumped,
    Membership,
    ReRegister,
    TierDecl,
    WorkerExpired,
    WorkerHeartbeat,
    WorkerInfo,
    WorkerRecord,
    WorkerRegistered,
)
from shoal.core.ring import Ring
from shoal.errors import InvalidArgument


def info(wid: str, port: int = 7000, host: str = "10.0.0.1") -> WorkerInfo:
    return WorkerInfo(
        wid,
        host,
        port,
        uds=f"/run/{wid}.sock",
        node="n1",
        tiers=(TierDecl("ssd", "/cache", 1 << 30),),
    )


def test_register_new_workers_bumps_epoch_each_time() -> None:
    m = Membership(expiry=10)
    assert m.epoch == 0
    t = m.register(info("a"), now=0)
    assert t.instructions == (WorkerRegistered("a"), EpochBumped(1))
    assert t.ring_changed and t.epoch == 1
    m.register(info("b"), now=1)
    m.register(info("c"), now=2)
    assert m.epoch == 3
    assert m.live_ids() == ["a", "b", "c"]
    ring = Ring.build(m.epoch, m.live_ids())
    assert ring.owner("ds/x") in {"a", "b", "c"}


def test_reregister_same_address_keeps_epoch_new_address_bumps() -> None:
    m = Membership(expiry=10)
    m.register(info("a"), now=0)
    t = m.register(info("a"), now=1)
    assert t.instructions == (WorkerRegistered("a"),)
    assert m.epoch == 1
    t = m.register(info("a", port=7001), now=2)
    assert t.ring_changed and m.epoch == 2
    rec = m.get("a")
    assert rec is not None and rec.info.port == 7001


def test_heartbeat_updates_time_and_stats() -> None:
    m = Membership(expiry=10)
    m.register(info("a"), now=0)
    t = m.heartbeat("a", now=5, stats={"corrupt_pages": 1})
    assert t.known and t.instructions == (WorkerHeartbeat("a"),)
    assert not t.ring_changed
    rec = m.get("a")
    assert rec is not None and rec.last_heartbeat == 5 and rec.stats == {"corrupt_pages": 1}
    # no stats: keep the previous ones
    m.heartbeat("a", now=6)
    rec = m.get("a")
    assert rec is not None and rec.stats == {"corrupt_pages": 1}


def test_heartbeat_from_unknown_worker_asks_to_register() -> None:
    m = Membership(expiry=10)
    t = m.heartbeat("ghost", now=1)
    assert not t.known
    assert t.instructions == (ReRegister("ghost"),)
    assert m.get("ghost") is None and m.epoch == 0


def test_tick_expires_silent_workers_with_one_bump() -> None:
    m = Membership(expiry=10)
    for w in "abc":
        m.register(info(w), now=0)
    m.heartbeat("c", now=8)
    assert m.tick(now=10).instructions == ()  # exactly at the limit: still live
    t = m.tick(now=10.5)
    assert t.instructions == (WorkerExpired("a"), WorkerExpired("b"), EpochBumped(4))
    assert m.live_ids() == ["c"]
    assert [r.state for r in m.records()] == [EXPIRED, EXPIRED, LIVE]
    assert m.tick(now=11).instructions == ()  # already expired: no repeat


def test_expired_worker_heartbeat_is_unknown_and_reregister_revives() -> None:
    m = Membership(expiry=1)
    m.register(info("a"), now=0)
    m.heartbeat("a", now=0.5, stats={"tiers": []})
    m.tick(now=5)
    assert m.epoch == 2 and m.live_ids() == []
    t = m.heartbeat("a", now=6)
    assert not t.known and m.live_ids() == []
    t = m.register(info("a"), now=7)
    assert t.ring_changed and m.epoch == 3 and m.live_ids() == ["a"]
    rec = m.get("a")
    assert rec is not None and rec.stats == {"tiers": []}  # stats kept until the next beat


def test_restore_keeps_epoch_and_states() -> None:
    recs = [
        WorkerRecord(info("a"), LIVE, 100.0),
        WorkerRecord(info("b"), EXPIRED, 100.0),
    ]
    m = Membership(expiry=5, epoch=42, workers=recs)
    assert m.epoch == 42 and m.live_ids() == ["a"]
    assert m.tick(now=104).instructions == ()
    t = m.tick(now=106)
    assert t.instructions == (WorkerExpired("a"), EpochBumped(43))


def test_clock_going_backwards_does_not_rewind_heartbeat() -> None:
    m = Membership(expiry=5)
    m.register(info("a"), now=10)
    m.heartbeat("a", now=3)
    rec = m.get("a")
    assert rec is not None and rec.last_heartbeat == 10


@pytest.mark.parametrize(
    "kwargs",
    [{"id": ""}, {"id": "a/b"}, {"id": " a"}, {"port": 70000}, {"port": -1}],
)
def test_invalid_worker_info(kwargs: dict[str, object]) -> None:
    base: dict[str, object] = {"id": "a", "host": "h", "port": 1}
    base.update(kwargs)
    with pytest.raises(InvalidArgument):
        WorkerInfo(**base)  # type: ignore[arg-type]


def test_invalid_membership_args() -> None:
    with pytest.raises(InvalidArgument):
        Membership(expiry=0)
    with pytest.raises(InvalidArgument):
        Membership(expiry=1, epoch=-1)


def test_worker_info_round_trip() -> None:
    i = info("a")
    assert WorkerInfo.from_dict(i.to_dict()) == i
    t = replace(i, tls=True)
    assert WorkerInfo.from_dict(t.to_dict()) == t
    # a record stored before workers said whether they speak TLS: plain
    old = {k: v for k, v in i.to_dict().items() if k != "tls"}
    assert WorkerInfo.from_dict(old).tls is False


def test_a_worker_that_turns_tls_on_moves_the_epoch() -> None:
    # clients read "tls" from the ring: holding an older ring, they must refresh it
    m = Membership(expiry=10)
    m.register(info("a"), now=0)
    t = m.register(replace(info("a"), tls=True), now=1)
    assert t.ring_changed and m.epoch == 2

"""Scale-in and the ring history as pure state (issue 13 item 4): a drained worker
leaves the ring at once but keeps heartbeating until it leaves; the master remembers
the rings before the current one with who held which dataset; the report and the
master's metrics count the files and bytes moved between workers."""

from __future__ import annotations

from shoal.core.membership import (
    DRAINING,
    EXPIRED,
    LEFT,
    LIVE,
    EpochBumped,
    Membership,
    WorkerInfo,
    WorkerRecord,
    WorkerRegistered,
)
from shoal.master.report import build_report
from shoal.master.ringhistory import WINDOW, RingHistory


def info(wid: str, port: int = 7000) -> WorkerInfo:
    return WorkerInfo(wid, "10.0.0.1", port)


def three() -> Membership:
    m = Membership(expiry=10)
    for i, w in enumerate("abc"):
        m.register(info(w, 7000 + i), now=0)
    return m


def test_a_drained_worker_leaves_the_ring_at_once_and_serves_until_it_leaves() -> None:
    m = three()
    t = m.drain("b")
    assert t.instructions == (WorkerRegistered("b"), EpochBumped(4)) and t.ring_changed
    assert m.live_ids() == ["a", "c"]
    rec = m.get("b")
    assert rec is not None and rec.state == DRAINING and rec.serving and not rec.live
    assert m.drain("b").instructions == ()  # twice: nothing more
    beat = m.heartbeat("b", now=5)
    assert beat.known  # still heartbeating while it hands over
    left = m.leave("b")
    assert left.instructions == (WorkerRegistered("b"),) and not left.ring_changed
    rec = m.get("b")
    assert rec is not None and rec.state == LEFT and not rec.serving
    assert not m.heartbeat("b", now=6).known  # gone: a heartbeat asks it to register
    assert m.register(info("b", 7001), now=7).ring_changed  # back: live again
    assert m.live_ids() == ["a", "b", "c"]


def test_drain_and_leave_refuse_workers_that_are_not_there() -> None:
    m = three()
    assert not m.drain("zz").known
    assert not m.leave("a").known  # only a draining worker leaves
    m.tick(now=100)  # every worker expired
    assert not m.drain("a").known


def test_a_silent_draining_worker_expires_without_moving_the_ring() -> None:
    m = three()
    m.drain("b")
    m.heartbeat("a", now=20)
    m.heartbeat("c", now=20)
    t = m.tick(now=20)
    rec = m.get("b")
    assert rec is not None and rec.state == EXPIRED
    assert not t.ring_changed and m.live_ids() == ["a", "c"]


def rec(
    wid: str, files: int, state: str = LIVE, moved: dict[str, int] | None = None
) -> WorkerRecord:
    stats: dict[str, object] = {"datasets": {"ds": {"cached_files": files}}}
    if moved is not None:
        stats["moved"] = moved
    return WorkerRecord(info(wid), state, 0.0, stats)  # type: ignore[arg-type]


def test_the_history_keeps_earlier_rings_with_who_held_what() -> None:
    h = RingHistory(2, ["a", "b"])
    h.moved(3, ["a", "b", "c"], [rec("a", 5), rec("b", 0), rec("c", 0)], now=10.0)
    body = h.body(now=11.0, reachable={"a", "b", "c"})
    assert body == [{"epoch": 2, "age_s": 1.0, "workers": ["a", "b"], "holders": {"a": ["ds"]}}]
    # a worker that is no longer reachable is not offered as a holder
    assert h.body(now=11.0, reachable={"b", "c"})[0]["holders"] == {}
    # an epoch bump that kept the members (an address change) adds nothing
    h.moved(4, ["c", "b", "a"], [], now=12.0)
    assert len(h.body(now=12.0, reachable={"a"})) == 1
    # old rings age out
    assert h.body(now=10.0 + WINDOW + 1, reachable={"a"}) == []


def test_the_report_counts_moved_files_and_bytes() -> None:
    records = [
        rec("a", 3, moved={"files_in": 4, "bytes_in": 400, "files_out": 0, "bytes_out": 0}),
        rec("b", 0, LEFT, moved={"files_in": 0, "bytes_in": 0, "files_out": 4, "bytes_out": 400}),
        rec("c", 2),
    ]
    r = build_report(records, ["ds"], now=1.0, epoch=5)
    t = r["totals"]
    assert (t["moved_files"], t["moved_bytes"]) == (4, 400)
    assert (t["handed_over_files"], t["handed_over_bytes"]) == (4, 400)
    by_id = {w["id"]: w for w in r["workers"]}
    assert by_id["b"]["state"] == "left" and by_id["b"]["moved"]["files_out"] == 4
    assert by_id["c"]["moved"] == {"files_in": 0, "bytes_in": 0, "files_out": 0, "bytes_out": 0}

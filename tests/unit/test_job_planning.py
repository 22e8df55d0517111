import pytest

from shoal.core.jobs import JobSpec, Progress, plan, replan
from shoal.core.ring import Ring
from shoal.errors import InvalidArgument


def items(n: int, size: int = 100) -> list[list]:
    return [[f"m/{i:05d}", size, "v"] for i in range(n)]


def test_spec_round_trip_and_validation() -> None:
    s = JobSpec("load", "ds", ("m/a",), glob="*.jpg", replicas=2, verify=True)
    assert JobSpec.from_dict(s.to_dict()) == s
    for bad in (
        dict(kind="copy", dataset="ds"),
        dict(kind="free", dataset="ds", verify=True),
        dict(kind="load", dataset="ds", replicas=0),
    ):
        with pytest.raises(InvalidArgument):
            JobSpec(**bad)  # type: ignore[arg-type]
    assert JobSpec("load", "ds", files=("m/b", "m/a", "m/b")).prefixes() == ["m/a", "m/b"]


def test_plan_batches_by_owner_and_limits() -> None:
    ring = Ring.build(1, ["a", "b", "c"])
    tasks = plan("ds", items(2000), ring, replicas=1, batch_files=300)
    assert sum(len(b) for _, b in tasks) == 2000
    assert all(len(b) <= 300 for _, b in tasks)
    for w, b in tasks:
        assert all(ring.owner(f"ds/{i[0]}") == w for i in b)
    big = plan("ds", items(10, size=100 << 20), ring, 1, batch_bytes=250 << 20)
    assert all(sum(i[1] for i in b) <= 250 << 20 for _, b in big)


def test_replicas_and_local_placement() -> None:
    ring = Ring.build(1, ["a", "b", "c"])
    tasks = plan("ds", items(300), ring, replicas=2)
    assert sum(len(b) for _, b in tasks) == 600
    local = plan("ds", items(10), ring, replicas=1, local=True)
    assert sorted(w for w, _ in local) == ["a", "b", "c"]


def test_replan_gives_a_lost_workers_share_to_the_new_owners() -> None:
    before = Ring.build(1, ["a", "b", "c"])
    share = [i for i in items(500) if before.owner(f"ds/{i[0]}") == "a"]
    after = Ring.build(2, ["b", "c"])
    moved = replan("ds", share, after, replicas=1, local=False)
    assert sum(len(b) for _, b in moved) == len(share)
    for w, b in moved:
        assert all(after.owner(f"ds/{i[0]}") == w for i in b)


def test_progress_adds_up_and_caps_failures() -> None:
    total = Progress()
    for _ in range(3):
        total.add(
            Progress(files_done=2, bytes_done=10, files_failed=60, failures=[["p", "why"]] * 60)
        )
    assert (total.files_done, total.bytes_done, total.files_failed) == (6, 30, 180)
    assert len(total.failures) == 100

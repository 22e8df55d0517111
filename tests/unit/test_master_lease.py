"""The state directory's lock (shoal.master.lease): one holder, a waiting standby,
fencing when the file no longer names the holder. flock locks belong to an open
file, so two StateLocks in one process exclude each other as two processes would."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from shoal.errors import InvalidArgument
from shoal.master.lease import StateLock, holder, in_use


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    first = StateLock(str(tmp_path))
    first.acquire()
    first.publish("http://10.0.0.1:19999")
    with pytest.raises(InvalidArgument, match=r"pid \d+ on .*http://10.0.0.1:19999.*--standby"):
        StateLock(str(tmp_path)).acquire()
    assert in_use(str(tmp_path)) is not None
    first.release()
    assert in_use(str(tmp_path)) is None
    again = StateLock(str(tmp_path))
    again.acquire()
    assert again.still_ours()
    again.release()


def test_a_standby_takes_the_lock_when_the_holder_lets_go(tmp_path: Path) -> None:
    active = StateLock(str(tmp_path))
    active.acquire()
    standby = StateLock(str(tmp_path))
    stop = threading.Event()
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(standby.wait(stop)))
    t.start()
    t.join(0.3)
    assert t.is_alive() and not standby.held  # still waiting while the active holds it
    active.release()
    t.join(10)
    assert result == [True] and standby.held
    assert holder(standby.path)["token"] == standby.token  # type: ignore[index]
    assert not active.still_ours()
    standby.release()


def test_a_stopped_standby_gives_up_without_the_lock(tmp_path: Path) -> None:
    active = StateLock(str(tmp_path))
    active.acquire()
    standby = StateLock(str(tmp_path))
    stop = threading.Event()
    stop.set()
    assert standby.wait(stop) is False and not standby.held
    assert active.still_ours()
    active.release()


def test_the_holder_notices_when_the_file_names_another(tmp_path: Path) -> None:
    lock = StateLock(str(tmp_path))
    lock.acquire()
    assert lock.still_ours()
    # a shared filesystem broke the lock and another master wrote itself in
    with open(lock.path, "w") as f:
        json.dump({"token": "someone-else", "pid": 1, "host": "h2"}, f)
    assert not lock.still_ours()
    lock.release()


def test_a_replaced_lock_file_is_not_ours(tmp_path: Path) -> None:
    lock = StateLock(str(tmp_path))
    lock.acquire()
    os.replace(lock.path, str(tmp_path / "moved"))
    assert not lock.still_ours()
    # a new master locks the file now at the path, not the moved one
    other = StateLock(str(tmp_path))
    other.acquire()
    assert other.still_ours()
    other.release()
    lock.release()


def test_a_state_dir_that_cannot_be_made_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_bytes(b"")
    with pytest.raises(InvalidArgument, match=r"state directory .*afile: File exists"):
        StateLock(str(tmp_path / "afile"))

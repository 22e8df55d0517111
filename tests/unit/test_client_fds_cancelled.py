"""Descriptors a worker hands over are never left open when their reader gives up: a
call cancelled after the descriptors came (the answer's first bytes carry them), and a
directory's handover (one ask per local worker) cancelled by its caller's time limit
after some workers answered, or failed by one of them."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from shoal.client import wholefile
from shoal.client.conn import Connection, Response
from shoal.core.types import NEVER, CachePolicy, Dataset, Mount, split_path
from shoal.errors import NotFound
from shoal.proto.messages import LocateDirReply, StatRequest

MiB = 1 << 20


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_call_cancelled_after_its_descriptors_came_closes_them(tmp_path: Path) -> None:
    (tmp_path / "data").write_bytes(b"x")

    async def run() -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setblocking(False)
        theirs.setblocking(False)
        conn = Connection(ours, unix=True)
        fd = os.open(tmp_path / "data", os.O_RDONLY)
        before = _open_fds()
        call = asyncio.ensure_future(conn.call(StatRequest("ds", "m/k", 1), want_fds=True))
        loop = asyncio.get_running_loop()
        await loop.sock_recv(theirs, 1 << 16)  # the request
        # two bytes of the answer's header with a descriptor, then nothing more
        socket.send_fds(theirs, [b"\0\0"], [fd])
        os.close(fd)
        while _open_fds() == before - 1:  # not received yet
            await asyncio.sleep(0.001)
        assert _open_fds() == before  # the received copy is open in this process
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert _open_fds() == before - 2  # received copy closed, the socket too
        theirs.close()

    asyncio.run(run())


class _Router:
    """Two local workers as open_local_dir sees them: ``fast`` answers at once with a
    descriptor per large file of the directory; ``slow`` answers after ``slow_s`` (or
    raises ``slow_error``)."""

    def __init__(self, data: Path, slow_s: float, slow_error: Exception | None = None) -> None:
        self.data = data
        self.slow_s, self.slow_error = slow_s, slow_error
        pol = CachePolicy(staleness=NEVER, page_size=MiB)
        self.ds = Dataset("ds", (Mount("m", "file:///x"),), pol)
        self.answered: list[str] = []

    async def resolve(self, path: str) -> tuple[Dataset, object]:
        return self.ds, split_path(path)

    async def ring(self) -> None:
        return None

    def is_local(self, w: object) -> bool:
        return True

    async def send(self, w: SimpleNamespace, req: object, want_fds: bool) -> Response[object]:
        if w.id == "slow":
            await asyncio.sleep(self.slow_s)
            if self.slow_error is not None:
                raise self.slow_error
        fds = [os.open(self.data, os.O_RDONLY) for _ in range(3)]
        runs = [[f"m/d/f{i}", "v1", 3 * MiB, 1.0, i, 0] for i in range(3)]
        self.answered.append(w.id)
        return Response(LocateDirReply(fds=[[0, 0]] * 3, runs=runs), b"", 1, fds)  # type: ignore[arg-type]


def _client(router: _Router) -> SimpleNamespace:
    workers = {i: SimpleNamespace(id=i) for i in ("fast", "slow")}
    return SimpleNamespace(router=router, cache=SimpleNamespace(workers=workers))


def test_a_directory_handover_cut_short_closes_what_came(tmp_path: Path) -> None:
    (tmp_path / "data").write_bytes(b"x" * 100)

    async def run() -> None:
        before = _open_fds()
        r = _Router(tmp_path / "data", slow_s=0.05)
        got = await wholefile.open_local_dir(_client(r), "/ds/m/d")  # type: ignore[arg-type]
        assert sorted(got) == [f"/ds/m/d/f{i}" for i in range(3)]  # one copy per file
        assert _open_fds() == before + 3
        for fd, _ in got.values():
            os.close(fd)
        assert _open_fds() == before

        # the caller's time limit ends the ask after the fast worker answered
        r = _Router(tmp_path / "data", slow_s=30.0)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(wholefile.open_local_dir(_client(r), "/ds/m/d"), 0.05)  # type: ignore[arg-type]
        assert r.answered == ["fast"]
        await asyncio.sleep(0)  # the done callbacks
        assert _open_fds() == before

        # one worker fails with an error the handover does not expect, after the other
        # answered
        r = _Router(tmp_path / "data", slow_s=0.01, slow_error=NotFound("gone"))
        with pytest.raises(NotFound):
            await wholefile.open_local_dir(_client(r), "/ds/m/d")  # type: ignore[arg-type]
        assert r.answered == ["fast"]
        await asyncio.sleep(0)
        assert _open_fds() == before

    asyncio.run(run())

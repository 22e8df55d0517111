"""A large manifest is decoded off the caller's event loop (a worker's loop answers
reads and sends heartbeats meanwhile); a small one inline, where a thread hop would
cost more than its decode. Against a real aiohttp server (test_master_api_client's)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from test_master_api_client import FakeMaster, fake, master

from shoal.core.manifest import Entry, Manifest
from shoal.proto import control, master_api
from shoal.proto.master_api import MasterAPI

__all__ = ["fake", "master"]  # the fixtures, used by name


class _Spy:
    """Stands in for Manifest in master_api: records the thread each decode ran on."""

    threads: list[int] = []

    @classmethod
    def from_bytes(cls, raw: bytes) -> Manifest:
        cls.threads.append(threading.get_ident())
        return Manifest.from_bytes(raw)


@pytest.mark.parametrize("files", [10, 30_000])
async def test_large_manifests_decode_in_a_thread(
    fake: FakeMaster, master: MasterAPI, monkeypatch: Any, files: int
) -> None:
    man = Manifest("d", [Entry(f"m/d{i // 1000}/f{i:06d}", i, f"v{i}", 1.0) for i in range(files)])
    raw = man.to_bytes()
    large = len(raw) >= master_api.MANIFEST_INLINE_MAX
    assert large == (files > 10)
    headers = {"Content-Type": control.MSGPACK, control.MANIFEST_HEADER: "m-1"}
    fake.answer("GET", control.manifest_path("d"), raw=raw, headers=headers)
    _Spy.threads = []
    monkeypatch.setattr(master_api, "Manifest", _Spy)
    got = await master.manifest("d")
    assert got is not None and got[0] == "m-1" and len(got[1]) == files
    assert got[1].to_bytes() == raw  # the same entries either way
    on_loop = _Spy.threads == [threading.get_ident()]
    assert on_loop is not large

"""Model-based test: a DiskTier against a dict, through puts, reads, deletes, restarts.

Under a small quota the tier may evict, so a read may miss; it must never return bytes
other than the model's, never exceed its capacity, and never lose a pinned file.
"""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from shoal.config import TierSpec
from shoal.core.types import FileKey
from shoal.store.disk import DiskTier
from shoal.testing.store_conformance import PAGE, blob, put_file

CAPACITY = 96 * 1024
NAMES = st.sampled_from([f"f{i}" for i in range(12)])
VERSIONS = st.sampled_from(["v1", "v2"])
SIZES = st.sampled_from([0, 100, 3000, PAGE, PAGE + 1, 3 * PAGE + 7])


class DiskTierModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="shoal-model-")
        self.spec = TierSpec("ssd", self.root, CAPACITY, eviction="lru")
        self.tier = DiskTier(self.spec, segment_size=16 * 1024)
        self.model: dict[FileKey, bytes] = {}
        self.pinned: set[FileKey] = set()
        self.seed = 0

    def teardown(self) -> None:
        self.tier.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(name=NAMES, version=VERSIONS, size=SIZES, pin=st.booleans())
    def put(self, name: str, version: str, size: int, pin: bool) -> None:
        fk = FileKey("ds", name, version)
        if fk in self.model:
            data = self.model[fk]
        else:
            self.seed += 1
            data = blob(self.seed, size)
        pin = pin and len(self.pinned) < 2
        if put_file(self.tier, fk, data, pin=pin):
            self.model[fk] = data
            if pin:
                self.pinned.add(fk)
            self._check(fk, must=True)

    @rule(name=NAMES, version=VERSIONS)
    def get(self, name: str, version: str) -> None:
        self._check(FileKey("ds", name, version), must=False)

    @rule(name=NAMES, version=VERSIONS)
    def delete(self, name: str, version: str) -> None:
        fk = FileKey("ds", name, version)
        self.tier.delete(fk)
        self.model.pop(fk, None)
        self.pinned.discard(fk)
        assert not self.tier.contains(fk.page(0))

    @rule()
    def restart(self) -> None:
        self.tier.close()
        self.tier = DiskTier(self.spec, segment_size=16 * 1024)

    def _check(self, fk: FileKey, *, must: bool) -> None:
        data = self.model.get(fk)
        # an unknown or empty file is checked as one empty page
        pages = [data[i : i + PAGE] for i in range(0, len(data), PAGE)] if data else [b""]
        for i, expected in enumerate(pages):
            got = self.tier.get(fk.page(i))
            if data is None:
                assert got is None
            elif must or fk in self.pinned:
                assert got == expected
            else:
                assert got in (None, expected)

    @invariant()
    def within_capacity(self) -> None:
        assert self.tier.usage().used <= CAPACITY

    @invariant()
    def pinned_stay(self) -> None:
        for fk in self.pinned:
            assert self.tier.contains(fk.page(0))

    @invariant()
    def dataset_bytes_add_up(self) -> None:
        # the heartbeat's per-dataset bytes are a running count: it must equal the sum
        cat = self.tier._cat
        for ds, files in cat.datasets.items():
            assert cat.dataset_bytes.get(ds, 0) == sum(st.bytes for st in files.values())
        assert set(cat.dataset_bytes) <= set(cat.datasets)


DiskTierModel.TestCase.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
TestDiskTierModel = DiskTierModel.TestCase

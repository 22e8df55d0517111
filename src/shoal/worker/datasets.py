"""The worker's copy of the dataset definitions and the under-storage driver per mount.

Definitions come from the master and are kept in ``<work_dir>/datasets.json`` so that
a worker restarted while the master is down still serves every dataset it knew.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from shoal.core.types import Dataset, Mount, NsPath
from shoal.errors import DatasetNotFound, PathOutsideDataset
from shoal.ufs.base import UnderStore
from shoal.ufs.registry import open_store

log = logging.getLogger("shoal.worker.datasets")


class DatasetTable:
    def __init__(self, cache_file: Path) -> None:
        self._file = cache_file
        self._by_name: dict[str, Dataset] = {}
        #: (dataset, mount) -> (the mount as JSON, its driver, the Mount it was opened for)
        self._ufs: dict[tuple[str, str], tuple[str, UnderStore, Mount]] = {}
        self.generation = -1
        self._load()

    def _load(self) -> None:
        try:
            raw = json.loads(self._file.read_text())
            self._by_name = {d["name"]: Dataset.from_dict(d) for d in raw["datasets"]}
            log.info("loaded %d dataset definitions from %s", len(self._by_name), self._file)
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable %s: %s", self._file, exc)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def get(self, name: str) -> Dataset:
        ds = self._by_name.get(name)
        if ds is None:
            raise DatasetNotFound(f"no dataset {name!r}")
        return ds

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def replace(self, datasets: list[Dataset], generation: int) -> list[str]:
        """Install a new set of definitions; returns the names that went away."""
        new = {d.name: d for d in datasets}
        gone = [n for n in self._by_name if n not in new]
        self._by_name = new
        self.generation = generation
        tmp = self._file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"datasets": [d.to_dict() for d in datasets]}))
        os.replace(tmp, self._file)
        return gone

    def ufs(self, ds: Dataset, mount_name: str) -> UnderStore:
        """The driver for one mount, opened once and reused while the mount is unchanged."""
        mount = ds.mount(mount_name)
        hit = self._ufs.get((ds.name, mount_name))
        if hit is not None and hit[2] is mount:
            return hit[1]  # the same definition object: no need to compare it (hot path)
        ident = json.dumps(mount.to_dict(), sort_keys=True)
        if hit is not None and hit[0] == ident:
            self._ufs[(ds.name, mount_name)] = (ident, hit[1], mount)
            return hit[1]
        store = open_store(mount)
        self._ufs[(ds.name, mount_name)] = (ident, store, mount)
        return store

    def resolve(self, dataset: str, path: str) -> tuple[Dataset, UnderStore, str]:
        """'<mount>/<rel>' inside a dataset -> (dataset, driver, rel)."""
        ds = self.get(dataset)
        mount, _, rel = path.partition("/")
        if not mount:
            raise PathOutsideDataset(f"path {str(NsPath(dataset, '', ''))!r} is the dataset root")
        return ds, self.ufs(ds, mount), rel

    async def close(self) -> None:
        for _, store, _m in self._ufs.values():
            try:
                await store.close()
            except Exception as exc:  # closing is best effort; log what went wrong
                log.warning("closing %s: %s", store.describe(), exc)
        self._ufs.clear()

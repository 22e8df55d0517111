"""PyTorch datasets over shoal: map-style and iterable, with sampler-aware prefetch.

Both take a namespace path (listed recursively, files sorted) or an explicit list of
paths, and a ``transform(path, data)`` applied to each sample (default: the bytes).
Both work in DataLoader workers under fork and spawn: they hold a
:class:`~shoal.client.Client`, which is fork-safe and pickles to its settings.

:class:`ShoalMapDataset` fetches a DataLoader batch with one ``cat_many`` (one request
per shoal worker). Given the epoch's order (:meth:`ShoalMapDataset.set_epoch_order`,
or :class:`ShoalSampler`), each process prefetches the samples it will be asked for
next: a DataLoader hands batches to its workers round-robin, so worker ``w`` of ``W``
gets batches ``w, w+W, ...`` of the order. :class:`ShoalIterableDataset` shards its
order over distributed ranks and DataLoader workers, always prefetches (it knows its
order), and saves and restores its position (``state_dict``/``load_state_dict``).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, IterableDataset, RandomSampler, Sampler, get_worker_info

from shoal.client import Client
from shoal.errors import InvalidArgument, ShoalError
from shoal.prefetch import Prefetcher

Transform = Callable[[str, bytes], Any]


def list_files(client: Client, path: str) -> list[str]:
    """Every file under a namespace path, recursively, sorted."""
    out: list[str] = []
    todo = deque([path.removeprefix("shoal://").rstrip("/") or "/"])
    while todo:
        for e in client.ls(todo.popleft()):
            if e.is_dir:
                todo.append(e.path)
            else:
                out.append(e.path)
    if not out and path.count("/") > 2:
        info = client.stat(path)  # a single file
        if not info.is_dir:
            out.append(info.path)
    return sorted(out)


def _client(client: Client | None, master: str | None) -> Client:
    return client if client is not None else Client(master)


def _files(client: Client, source: str | Sequence[str]) -> list[str]:
    if isinstance(source, str):
        files = list_files(client, source)
        if not files:
            raise InvalidArgument(f"no files under {source}")
        return files
    return [p if p.startswith("/") else "/" + p.removeprefix("shoal://") for p in source]


def _value(path: str, got: bytes | ShoalError) -> bytes:
    if isinstance(got, ShoalError):
        raise got
    return got


class ShoalMapDataset(Dataset[Any]):
    """Files of a shoal path (or a list of paths) as a map-style dataset.

    ``prefetch``: how many samples ahead each process reads once the epoch's order is
    known (0: off); ``prefetch_bytes`` bounds its memory.
    """

    def __init__(
        self,
        source: str | Sequence[str],
        *,
        client: Client | None = None,
        master: str | None = None,
        transform: Transform | None = None,
        prefetch: int = 256,
        prefetch_bytes: int = 256 << 20,
    ) -> None:
        self.client = _client(client, master)
        self.files = _files(self.client, source)
        self.transform = transform
        self.prefetch = prefetch
        self._prefetcher = (
            Prefetcher(self.client, depth=prefetch, max_bytes=prefetch_bytes)
            if prefetch > 0
            else None
        )
        self._order: list[int] | None = None
        self._share: dict[int, list[int]] = {}  # batch size -> this process's part of the order
        self._started: int | None = None  # batch size the prefetcher was started with
        self._where: dict[int, int] = {}  # index -> its position in the share

    def __len__(self) -> int:
        return len(self.files)

    def set_epoch_order(self, indices: Sequence[int]) -> None:
        """The order in which the sampler will ask for samples this epoch. Call before
        ``iter(loader)`` (DataLoader workers are forked or spawned then)."""
        self._order = list(indices)
        self._share.clear()
        self._started = None

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        paths = [self.files[i] for i in indices]
        got: dict[int, bytes] = {}
        pf = self._prefetcher
        if pf is not None and self._order is not None:
            self._start(len(indices))
            for j, i in enumerate(indices):
                pos = self._where.get(i)
                data = pf.get(pos) if pos is not None else None
                if data is not None:
                    got[j] = data
        missing = [paths[j] for j in range(len(paths)) if j not in got]
        if missing:
            fetched = self.client.cat_many(missing) if len(missing) > 1 else None
            for j, p in enumerate(paths):
                if j not in got:
                    got[j] = _value(p, fetched[p]) if fetched else self.client.read(p)
        tf = self.transform
        return [tf(p, got[j]) if tf else got[j] for j, p in enumerate(paths)]

    def _start(self, batch: int) -> None:
        """Start prefetching this process's share, learning the batch size from the
        first request."""
        if self._started is not None or self._order is None or self._prefetcher is None:
            return
        info = get_worker_info()
        workers, me = (info.num_workers, info.id) if info is not None else (1, 0)
        share: list[int] = []
        for lo in range(me * batch, len(self._order), workers * batch):
            share.extend(self._order[lo : lo + batch])
        self._where = {}
        for pos, i in enumerate(share):
            self._where.setdefault(i, pos)
        self._started = batch
        self._prefetcher.start([self.files[i] for i in share])

    def prefetch_stats(self) -> dict[str, int]:
        """This process's prefetch counters (hits, waited, misses, fetched, requests)."""
        return self._prefetcher.stats.to_dict() if self._prefetcher is not None else {}

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()


class ShoalSampler(Sampler[int]):
    """Wraps a sampler (default: random or sequential) and tells the dataset each
    epoch's order, so that it can prefetch. With ``num_workers > 0`` call
    :meth:`set_epoch` before each ``iter(loader)``, as with DistributedSampler."""

    def __init__(
        self,
        dataset: ShoalMapDataset,
        sampler: Sampler[int] | Iterable[int] | None = None,
        *,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        self.dataset = dataset
        if sampler is None:
            gen = torch.Generator().manual_seed(seed)
            sampler = RandomSampler(dataset, generator=gen) if shuffle else range(len(dataset))
        self.sampler = sampler
        #: this epoch's order, as told to the dataset
        self.order: list[int] = []
        self._fresh = False

    def set_epoch(self, epoch: int) -> None:
        set_inner = getattr(self.sampler, "set_epoch", None)
        if callable(set_inner):
            set_inner(epoch)
        self.order = [int(i) for i in self.sampler]
        self._fresh = True
        self.dataset.set_epoch_order(self.order)

    def __iter__(self) -> Iterator[int]:
        if not self._fresh:  # no set_epoch for this epoch: fine without workers
            self.set_epoch(0)
        self._fresh = False
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.dataset)


class ShoalIterableDataset(IterableDataset[Any]):
    """Files of a shoal path (or a list) streamed in order, or shuffled per epoch with
    ``seed + epoch``, each sample read by exactly one (rank, DataLoader worker)."""

    def __init__(
        self,
        source: str | Sequence[str],
        *,
        client: Client | None = None,
        master: str | None = None,
        transform: Transform | None = None,
        shuffle: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        prefetch: int = 256,
        prefetch_bytes: int = 256 << 20,
    ) -> None:
        self.client = _client(client, master)
        self.files = _files(self.client, source)
        self.transform = transform
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        if (rank is None) != (world_size is None):
            raise InvalidArgument("pass both rank and world_size, or neither")
        if world_size is not None and rank is not None and not 0 <= rank < world_size:
            raise InvalidArgument(f"rank {rank} is outside world_size {world_size}")
        self.rank, self.world_size = rank, world_size
        self._prefetcher = Prefetcher(self.client, depth=max(1, prefetch), max_bytes=prefetch_bytes)
        self._yielded = 0
        self._resume: int | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _shard(self) -> tuple[int, int]:
        if self.rank is not None and self.world_size is not None:
            rank, world = self.rank, self.world_size
        elif dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            rank, world = 0, 1
        info = get_worker_info()
        workers, me = (info.num_workers, info.id) if info is not None else (1, 0)
        return rank * workers + me, world * workers

    def shard_files(self) -> list[str]:
        """The files this (rank, worker) reads this epoch, in order."""
        order = list(range(len(self.files)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        index, count = self._shard()
        return [self.files[i] for i in order[index::count]]

    def __iter__(self) -> Iterator[Any]:
        mine = self.shard_files()
        start, self._resume = self._resume or 0, None
        self._yielded = start
        rest = mine[start:]
        pf = self._prefetcher
        pf.start(rest)
        tf = self.transform
        for pos, path in enumerate(rest):
            data = pf.get(pos)
            if data is None:
                data = self.client.read(path)
            self._yielded = start + pos + 1
            yield tf(path, data) if tf else data

    def state_dict(self) -> dict[str, Any]:
        """Where this process's shard stands: resume with :meth:`load_state_dict`."""
        index, count = self._shard()
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "shard": [index, count],
            "yielded": self._yielded,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration continue after the samples already yielded."""
        index, count = self._shard()
        if list(state["shard"]) != [index, count]:
            raise InvalidArgument(
                f"state is for shard {state['shard'][0]} of {state['shard'][1]}, this process "
                f"reads shard {index} of {count}: resume with the same world size and workers"
            )
        self.epoch = int(state["epoch"])
        self.seed = int(state["seed"])
        self._resume = self._yielded = int(state["yielded"])

    def prefetch_stats(self) -> dict[str, int]:
        return self._prefetcher.stats.to_dict()

    def close(self) -> None:
        self._prefetcher.close()

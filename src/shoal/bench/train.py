"""Workload (d): a PyTorch DataLoader with N workers reading and decoding samples while
the "model step" takes a fixed time per batch, against the same loop on synthetic
in-memory data. Runs in a forked child so torch never loads in the suite's process."""

from __future__ import annotations

import multiprocessing as mp
import resource
import time
from typing import Any

from shoal.bench.contenders import Contender
from shoal.bench.stats import Sample

DECODE = 3 * 64 * 64  # bytes turned into one 3x64x64 float tensor per sample


def _loop(
    contender: Contender | None, keys: list[str], workers: int, batch: int, step_ms: float, out: Any
) -> None:
    try:
        _loop_body(contender, keys, workers, batch, step_ms, out)
    except BaseException as exc:  # the parent must not wait forever
        out.put(exc.__class__.__name__ + ": " + str(exc)[:300])


def _loop_body(
    contender: Contender | None, keys: list[str], workers: int, batch: int, step_ms: float, out: Any
) -> None:
    import torch
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)
    blob = bytes(range(256)) * (100_000 // 256 + 1)

    class Files(Dataset[Any]):
        def __init__(self) -> None:
            self.read: Any = None
            self.c = contender

        def __len__(self) -> int:
            return len(keys)

        def __getitem__(self, i: int) -> Any:
            if self.c is None:
                data = blob  # synthetic: bytes already in memory
            else:
                if self.read is None:
                    self.read = _bytes_reader(self.c)
                data = self.read(keys[i])
            t = torch.frombuffer(bytearray(data[:DECODE]), dtype=torch.uint8)
            return t.float().div_(255.0).view(3, 64, 64), len(data)

    dl = DataLoader(
        Files(), batch_size=batch, shuffle=True, num_workers=workers,
        persistent_workers=False, prefetch_factor=4 if workers else None,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    n = nbytes = 0
    for x, sizes in dl:
        time.sleep(step_ms / 1000.0)  # the model step: the accelerator is busy, the CPU idle
        n += int(x.shape[0])
        nbytes += int(sizes.sum())
    secs = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    rc = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime) + rc.ru_utime + rc.ru_stime
    out.put((secs, n, nbytes, cpu))


def _bytes_reader(c: Contender) -> Any:
    """A reader that returns the bytes (the contenders' readers return lengths)."""
    name = c.name
    if name == "local-dir" or hasattr(c, "mnt"):
        root = c.env.local_root if name == "local-dir" else c.root  # type: ignore[attr-defined]

        def read_file(key: str) -> bytes:
            with open(root / key, "rb", buffering=0) as f:
                return f.read()

        return read_file
    if name.startswith("shoal-"):
        from shoal.client import Client

        cl = Client(c.env.master)
        return lambda key: cl.read(f"/{c.env.dataset}/data/{key}")
    if name == "boto3":
        from shoal.bench.contenders import boto3_client

        s3 = boto3_client(c.env.endpoint)
        return lambda key: s3.get_object(Bucket=c.env.bucket, Key=key)["Body"].read()
    fs = c._fs()  # type: ignore[attr-defined]
    return lambda key: fs.cat_file(f"{c.env.bucket}/{key}")


def train(
    contender: Contender | None, keys: list[str], workers: int, batch: int, step_ms: float
) -> Sample:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_loop, args=(contender, keys, workers, batch, step_ms, q))
    p.start()
    try:
        got = q.get(timeout=1800)
        if isinstance(got, str):
            raise RuntimeError(got)
        secs, n, nbytes, cpu = got
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()
    pids = contender.daemon_pids() if contender else []
    del pids
    return Sample(secs, n, nbytes, cpu)

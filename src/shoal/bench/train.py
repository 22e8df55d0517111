"""Workload (d), a training loop as users write it: a PyTorch DataLoader with N
workers that reads JPEGs (bench/images.py), decodes them torchvision-style (PIL open,
``convert("RGB")``, resize to 224x224, to a float tensor) and feeds batches to a
"model step" that takes a fixed time (the accelerator is busy, the CPU idle).

The loaders compared, each with the same decode, sampler seed and step:

- ``local-dir``: an ImageFolder-like dataset over the local copy of the files;
- ``shoal-fuse``: the same dataset over shoal's FUSE mount;
- ``shoal-fuse-kopen``: a second mount of it with ``--kernel-open`` (warm epochs only):
  no OPEN and RELEASE round trip per sample, only the IOCTL of ``open()``'s isatty;
- ``shoal-torch``: :class:`shoal.torch.ShoalMapDataset` with :class:`ShoalSampler`
  (batched reads, prefetch of each worker's share);
- ``boto3``: one GET per sample through the same shaper (the cold reference);
- ``synthetic``: a tensor already in memory, no read and no decode (the ceiling).

torchvision is not importable beside the CPU torch a clean set-up installs, so the
ImageFolder equivalent and the transform are written here (a few lines of PIL): the
same calls torchvision makes for ``ImageFolder`` + ``Resize`` + ``ToTensor``.

Each (loader, worker count) runs in one forked child (torch never loads in the
suite's process) that times every epoch; CPU per epoch is the child, its reaped
DataLoader workers and the loader's daemons (shoal worker, FUSE daemon)."""

from __future__ import annotations

import multiprocessing as mp
import queue
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.bench import runner
from shoal.bench.contender import Contender
from shoal.bench.stats import Sample

if TYPE_CHECKING:
    from shoal.bench.suite import Suite

SIDE = 224  # the decoded sample: 3 x SIDE x SIDE floats, as a ResNet's input

KOPEN = "shoal-fuse-kopen"
LOADERS = ("synthetic", "local-dir", "shoal-fuse", KOPEN, "shoal-torch", "boto3")
ABOUT = {
    KOPEN: "shoal FUSE mount with --kernel-open (no open round trips, no passthrough)",
    "shoal-torch": "shoal.torch.ShoalMapDataset + ShoalSampler (batched reads, prefetch)",
    "synthetic": "training loop on a tensor in memory: no read, no decode (the ceiling)",
}


@dataclass(frozen=True)
class Source:
    """Where one loader reads: a directory (local, FUSE), shoal, or S3."""

    kind: str  # one of LOADERS
    keys: tuple[str, ...]
    sizes: tuple[int, ...]  # bytes of each key (synthetic counts them as read)
    root: Path | None = None  # directory loaders
    master: str = ""  # shoal-torch
    dataset: str = ""
    endpoint: str = ""  # boto3
    bucket: str = ""


@dataclass(frozen=True)
class Loop:
    workers: int
    batch: int = 32
    step_ms: float = 10.0
    seed: int = 0


def label_of(key: str) -> int:
    """ImageFolder's target: the class folder's index (``img/c03/x.jpg`` -> 3)."""
    return int(key.rsplit("/", 2)[-2].lstrip("c"))


def _decode(data: Any) -> Any:
    """PIL image (path or file object) -> 3xSxS float tensor in [0, 1], as
    ``Resize((S, S))`` + ``ToTensor()`` make it."""
    import torch
    from PIL import Image

    with Image.open(data) as im:
        img = im.convert("RGB").resize((SIDE, SIDE), Image.Resampling.BILINEAR)
    t = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
    return t.view(SIDE, SIDE, 3).permute(2, 0, 1).float().div_(255.0)


def _datasets(src: Source) -> tuple[Any, Callable[[int], Any]]:
    """(dataset, sampler for epoch e): the loader's own dataset and sampler."""
    import io

    import torch
    from torch.utils.data import Dataset, RandomSampler

    keys, sizes = src.keys, src.sizes

    def shuffled(e: int) -> Any:
        return RandomSampler(range(len(keys)), generator=torch.Generator().manual_seed(e))

    if src.kind == "shoal-torch":
        from shoal.torch import ShoalMapDataset, ShoalSampler

        paths = [f"/{src.dataset}/data/{k}" for k in keys]
        ds = ShoalMapDataset(
            paths,
            master=src.master,
            transform=lambda p, b: (_decode(io.BytesIO(b)), label_of(p), len(b)),
        )
        sampler = ShoalSampler(ds, seed=0)

        def shoal_epoch(e: int) -> Any:
            sampler.set_epoch(e)  # before iter(loader): the workers learn the order
            return sampler

        return ds, shoal_epoch

    class Images(Dataset[Any]):
        """ImageFolder's __getitem__: read, decode, transform; (tensor, class, bytes)."""

        def __init__(self) -> None:
            self.read: Callable[[str], bytes] | None = None
            self.fixed = torch.rand(3, SIDE, SIDE)

        def __len__(self) -> int:
            return len(keys)

        def __getitem__(self, i: int) -> Any:
            k = keys[i]
            if src.kind == "synthetic":
                return self.fixed, label_of(k), sizes[i]
            if src.root is not None:
                path = src.root / k
                return _decode(path), label_of(k), path.stat().st_size
            if self.read is None:  # one S3 client per DataLoader worker
                from shoal.bench.contenders import boto3_client

                s3 = boto3_client(src.endpoint)
                self.read = lambda key: s3.get_object(Bucket=src.bucket, Key=key)["Body"].read()
            data = self.read(k)
            return _decode(io.BytesIO(data)), label_of(k), len(data)

    return Images(), shuffled


def _serve(req: Any, resp: Any) -> None:
    """The training child: imports torch once, then runs each request it is sent."""
    while (item := req.get()) is not None:
        try:
            resp.put(_epochs(*item))
        except BaseException as exc:  # the parent must not wait forever
            resp.put(f"{type(exc).__name__}: {str(exc)[:300]}")


def _epochs(
    src: Source, loop: Loop, epochs: int, pids: list[int]
) -> list[tuple[float, int, int, float]]:
    import warnings

    import torch

    torch.set_num_threads(1)
    # 8 workers on fewer cores is the point of the w8 row, not a mistake to warn about
    warnings.filterwarnings("ignore", "This DataLoader will create")
    ds, sampler_for = _datasets(src)
    try:
        return _timed(ds, sampler_for, loop, epochs, pids)
    finally:
        if hasattr(ds, "client"):  # ShoalMapDataset: its prefetcher and client
            ds.close()
            ds.client.close()


def _timed(
    ds: Any, sampler_for: Callable[[int], Any], loop: Loop, epochs: int, pids: list[int]
) -> list[tuple[float, int, int, float]]:
    from torch.utils.data import DataLoader

    from shoal.bench.runner import proc_cpu

    got = []
    for e in range(epochs):
        dl = DataLoader(
            ds, batch_size=loop.batch, sampler=sampler_for(loop.seed + e),
            num_workers=loop.workers, persistent_workers=False, prefetch_factor=4,
        )  # fmt: skip
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        d0 = proc_cpu(pids)
        t0 = time.perf_counter()
        n = nbytes = 0
        for x, _labels, sizes in dl:
            time.sleep(loop.step_ms / 1000.0)  # the model step
            n += int(x.shape[0])
            nbytes += int(sizes.sum())
        secs = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the epoch's workers, reaped
        cpu = sum(getattr(b, f) - getattr(a, f) for a, b in ((r0, r1), (c0, c1))
                  for f in ("ru_utime", "ru_stime")) + proc_cpu(pids) - d0  # fmt: skip
        got.append((secs, n, nbytes, cpu))
    return got


class Trainer:
    """One forked child that runs training loops on request, so that torch loads once
    per suite (its import costs seconds on a loaded machine) and never in the suite's
    own process; the parent resets caches between requests."""

    def __enter__(self) -> Trainer:
        ctx = mp.get_context("fork")
        self.req, self.resp = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_serve, args=(self.req, self.resp))
        self.proc.start()
        return self

    def run(self, src: Source, loop: Loop, epochs: int, pids: Sequence[int] = ()) -> list[Sample]:
        """``epochs`` epochs of the loop: one sample per epoch."""
        self.req.put((src, loop, epochs, list(pids)))
        deadline = time.monotonic() + 1800
        while True:
            try:
                got = self.resp.get(timeout=2)
                break
            except queue.Empty:
                if not self.proc.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the training child stopped (exit {self.proc.exitcode})"
                    ) from None
        if isinstance(got, str):
            raise RuntimeError(got)
        return [Sample(secs, n, nb, cpu) for secs, n, nb, cpu in got]

    def __exit__(self, *exc: object) -> None:
        self.req.put(None)
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def run(src: Source, loop: Loop, epochs: int, pids: Sequence[int] = ()) -> list[Sample]:
    """``epochs`` epochs of the loop in a child of its own."""
    with Trainer() as t:
        return t.run(src, loop, epochs, pids)


class SuiteRun:
    """The training workload inside the suite. Cold first: at each cold count, one GET
    per sample, then each shoal loader's first epoch after a reset. Then the warm
    epochs, interleaved per worker count (synthetic, local, shoal-torch, shoal-fuse,
    one epoch each, repeated), so that the load of a shared machine moves each loader
    alike; the cache holds every image by then (the last cold epoch read them all)."""

    def __init__(
        self, suite: Suite, fuse: Contender | None, t: Trainer, kopen: Contender | None = None
    ) -> None:
        cfg, env, imgs = suite.cfg, suite.env, suite.images
        assert env is not None and imgs is not None
        self.suite, self.env, self.fuse, self.t = suite, env, fuse, t
        self.kopen = kopen
        self.keys = tuple(imgs.keys())
        self.sizes = tuple(imgs.files[k] for k in self.keys)
        self.counts = tuple(cfg.train_workers)
        mid = len(self.counts) // 2  # --quick: cold epochs at the middle count only
        self.cold_counts = self.counts if not cfg.quick else self.counts[mid : mid + 1]

    def loop(self, w: int) -> Loop:
        cfg = self.suite.cfg
        return Loop(w, cfg.train_batch, cfg.train_step_ms)

    def source(self, kind: str) -> Source:
        env, k, s = self.env, self.keys, self.sizes
        if kind == "local-dir":
            return Source(kind, k, s, root=env.local_root)
        if kind == "shoal-fuse":
            return Source(kind, k, s, root=self.fuse.root)  # type: ignore[union-attr]
        if kind == KOPEN:
            return Source(kind, k, s, root=self.kopen.root)  # type: ignore[union-attr]
        if kind == "shoal-torch":
            return Source(kind, k, s, master=env.master, dataset=env.dataset)
        if kind == "boto3":
            return Source(kind, k, s, endpoint=env.endpoint, bucket=env.bucket)
        return Source(kind, k, s)

    def pids(self, kind: str) -> list[int]:
        if kind == "shoal-fuse" and self.fuse is not None:
            return self.fuse.daemon_pids()
        if kind == KOPEN and self.kopen is not None:
            return self.kopen.daemon_pids()
        c = self.suite.cluster
        if kind == "shoal-torch" and c is not None:
            return [p for n, p in c.pids.items() if n.startswith("worker")]
        return []

    def epoch(self, wl: str, kind: str, w: int) -> None:
        """One epoch into the report (a failure is a note, not the end of the run)."""
        say = self.suite.say
        try:
            s = self.t.run(self.source(kind), self.loop(w), 1, self.pids(kind))[0]
        except Exception as exc:
            msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            self.suite.report.add(wl, kind, None, f"failed: {msg}")
            say(f"  {wl:24} {kind:20} FAILED: {msg}")
            return
        self.suite.report.add(wl, kind, s)
        cpu = s.cpu_s / (s.nbytes / 1e9) if s.nbytes else 0.0
        say(f"  {wl:24} {kind:20} {s.files / s.seconds:9,.0f} samples/s, cpu {cpu:.1f} s/GB")

    def run(self) -> None:
        shoal = ["shoal-torch"] + (["shoal-fuse"] if self.fuse is not None else [])
        for w in self.cold_counts:
            runner.drop_caches()
            self.epoch(f"train cold w{w}", "boto3", w)
            for kind in shoal:
                if kind == "shoal-fuse" and self.fuse is not None:
                    self.fuse.cold()  # a fresh cluster (or dataset) and mount
                else:
                    self.suite.shoal_cold()
                runner.drop_caches()
                self.epoch(f"train cold w{w}", kind, w)
        if self.kopen is not None:
            try:  # mounted once the cold epochs are done (they start a fresh cluster)
                self.kopen.setup()
                shoal.append(KOPEN)
            except Exception as exc:
                self.suite.report.skipped[f"{KOPEN} (training)"] = f"setup failed: {exc}"[:200]
        for w in self.counts:
            for _ in range(max(1, self.suite.cfg.train_epochs)):
                for kind in ("synthetic", "local-dir", *shoal):
                    self.epoch(f"train warm w{w}", kind, w)


def run_suite(suite: Suite, by_name: dict[str, Contender]) -> None:
    """The training workload: every loader at every worker count (see SuiteRun)."""
    suite.report.about.update(ABOUT)
    fuse = by_name.get("shoal-fuse")
    if fuse is not None:
        try:
            fuse.setup()
        except Exception as exc:
            suite.report.skipped["shoal-fuse (training)"] = f"setup failed: {exc}"[:200]
            fuse = None
    kopen = kernel_open_mount(fuse) if fuse is not None else None
    try:
        with Trainer() as t:
            SuiteRun(suite, fuse, t, kopen).run()
    finally:
        if kopen is not None and hasattr(kopen, "mnt"):  # set up (SuiteRun.run)
            kopen.teardown()
        if fuse is not None:
            fuse.teardown()


def kernel_open_mount(fuse: Contender) -> Contender:
    """A second mount like ``fuse``, with --kernel-open, of the same cluster (its warm
    epochs read what the first mount's cold epoch cached)."""
    base: Any = type(fuse)

    class KernelOpen(base):
        name = KOPEN

        def command(self) -> tuple[list[str], dict[str, str]]:
            argv, env = base.command(self)
            return [*argv, "--kernel-open"], env

    return KernelOpen(fuse.env)

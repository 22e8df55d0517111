"""The remote store inside the benchmark namespace (moto's server, or a one-node Ceph
RGW from ``bench/rgw.sh``), and the benchmark data: generated once into a local
directory (the physical-limit contender reads it there) and uploaded to the store."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from shoal.bench.contenders import boto3_client
from shoal.bench.netshape import Link

RGW_SCRIPT_NAME = "rgw.sh"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def find_rgw_script() -> Path | None:
    here = Path(__file__).resolve()
    for base in (Path.cwd(), *here.parents):
        p = base / "bench" / RGW_SCRIPT_NAME
        if p.is_file():
            return p
    return None


class Store:
    """A store server reachable at ``endpoint`` (inside ``link``'s namespace)."""

    kind = ""
    endpoint = ""
    persistent = False

    def start(self) -> Store:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def pids(self) -> list[int]:
        return []


class MotoStore(Store):
    kind = "moto"

    def __init__(self, link: Link, port: int = 5000) -> None:
        self.link, self.port = link, port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> MotoStore:
        argv = [
            sys.executable,
            "-m",
            "moto.server",
            "-H",
            self.link.remote_ip,
            "-p",
            str(self.port),
        ]
        self.proc = self.link.popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.endpoint = f"http://{self.link.remote_ip}:{self.port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if _answers(self.endpoint + "/moto-api/"):
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("moto server did not start in the benchmark namespace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class RgwStore(Store):
    kind = "ceph-rgw"
    persistent = True

    def __init__(self, link: Link, dir: Path, port: int = 7480) -> None:
        self.link, self.dir, self.port = link, dir, port
        script = find_rgw_script()
        if script is None:
            raise RuntimeError("bench/rgw.sh not found (run from the repository)")
        self.script = script

    def _run(self, *args: str) -> str:
        env = dict(os.environ, RGW_NETNS=self.link.ns)
        r = subprocess.run(
            ["bash", str(self.script), *args], env=env, capture_output=True, text=True, timeout=300
        )
        if r.returncode != 0:
            raise RuntimeError(f"rgw.sh {args[0]} failed: {r.stderr.strip()[-800:]}")
        return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""

    def start(self) -> RgwStore:
        try:
            self.endpoint = self._run("start", str(self.dir), self.link.remote_ip, str(self.port))
        except (RuntimeError, subprocess.TimeoutExpired):
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.stop()  # whatever did start (a monitor) is not left running
            raise
        return self

    def stop(self) -> None:
        self._run("stop", str(self.dir))

    def pids(self) -> list[int]:
        out = []
        for name in ("mon.a", "osd.0", "client.rgw.bench"):
            try:
                out.append(int((self.dir / "run" / f"{name}.pid").read_text()))
            except (OSError, ValueError):
                pass
        return out


# -- data -------------------------------------------------------------------------


@dataclass
class DataSpec:
    small_files: int
    small_size: int = 100_000
    mix_files: int = 0
    mix_min: int = 10_000
    mix_max: int = 5_000_000
    large_size: int = 1 << 30
    seed: int = 0
    files: dict[str, int] = field(default_factory=dict)  # key -> size, filled by layout()

    def layout(self) -> DataSpec:
        rng = random.Random(self.seed)
        files: dict[str, int] = {}
        for i in range(self.small_files):
            files[f"small/{i // 100:03d}/f{i:06d}.bin"] = self.small_size
        for i in range(self.mix_files):
            # log-uniform between min and max: many thumbnails, some large frames
            size = int(self.mix_min * (self.mix_max / self.mix_min) ** rng.random())
            files[f"mix/{i // 100:03d}/img{i:06d}.jpg"] = size
        if self.large_size:
            files["large/blob.bin"] = self.large_size
        self.files = files
        return self

    def keys(self, prefix: str) -> list[str]:
        return [k for k in self.files if k.startswith(prefix + "/")]

    def digest(self) -> str:
        h = hashlib.sha256(json.dumps(sorted(self.files.items())).encode())
        return h.hexdigest()[:16]


def _content(key: str, size: int, blob: bytes) -> Iterator[bytes]:
    """Deterministic, incompressible, distinct per file: windows of a random blob."""
    h = int(hashlib.blake2b(key.encode(), digest_size=8).hexdigest(), 16)
    pos, left = h % (len(blob) // 2), size
    while left > 0:
        n = min(left, len(blob) - pos)
        yield blob[pos : pos + n]
        left -= n
        pos = 0


def write_local(spec: DataSpec, root: Path) -> None:
    """The files under ``root`` (skipped when a marker says they are already there)."""
    marker = root / f".complete-{spec.digest()}"
    if marker.exists():
        return
    # the files are shared by every data spec (quick, full): writing this one's may
    # change another's, so no other spec may stay marked complete
    for old in root.glob(".complete-*") if root.exists() else ():
        old.unlink()
    blob = random.Random(12345).randbytes(16 << 20)
    for key, size in spec.files.items():
        p = root / key
        if p.exists() and p.stat().st_size == size:
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "wb") as f:
            for part in _content(key, size, blob):
                f.write(part)
    marker.write_text("ok\n")


def upload(spec: DataSpec, root: Path, endpoint: str, bucket: str, marker: Path | None) -> float:
    """Put every file into ``bucket`` (directly, unshaped); seconds taken. With a
    ``marker`` file for a persistent store, a finished upload is not repeated."""
    if marker is not None and marker.exists() and marker.read_text().strip() == spec.digest():
        return 0.0
    t0 = time.perf_counter()
    s3 = boto3_client(endpoint, pool=32)
    try:
        s3.create_bucket(Bucket=bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    except Exception as exc:  # BucketAlreadyExists on some stores
        if "BucketAlready" not in str(exc):
            raise

    def put(key: str) -> None:
        path = root / key
        if spec.files[key] > 64 << 20:
            s3.upload_file(str(path), bucket, key)
        else:
            s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, spec.files))
    if marker is not None:
        marker.write_text(spec.digest() + "\n")
    return time.perf_counter() - t0

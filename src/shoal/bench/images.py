"""The training workload's images: real JPEGs made with Pillow, 10-500 KB, log-uniform
(many thumbnails, some large photos), in class folders as ImageFolder expects
(``img/c03/i000123.jpg``). Deterministic per seed, so the local copy, the store's
copy and every run hold the same bytes.

The pixels are smooth colour fields (noise at 1/8 scale, upsampled) plus fine grain,
encoded at quality 90: about the bytes per pixel of a camera JPEG, so decoding costs
what a photo of that file size costs (pure noise would give small pictures and cheap
decodes; flat colour, huge pictures)."""

from __future__ import annotations

import io
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

MIN_BYTES = 10_000
MAX_BYTES = 500_000
QUALITY = 90
CLASSES = 10
#: aspect ratio of every image (4:3, a camera's)
ASPECT = 4 / 3


def target_sizes(n: int, lo: int = MIN_BYTES, hi: int = MAX_BYTES, seed: int = 0) -> list[int]:
    """``n`` file sizes drawn log-uniformly from [lo, hi]."""
    if not 0 < lo <= hi:
        raise ValueError(f"image sizes need 0 < lo <= hi, got {lo}, {hi}")
    rng = random.Random(seed)
    return [int(lo * (hi / lo) ** rng.random()) for _ in range(n)]


def _picture(w: int, h: int, rng: random.Random) -> object:
    from PIL import Image

    cw, ch = max(2, w // 8), max(2, h // 8)
    coarse = Image.frombytes("RGB", (cw, ch), rng.randbytes(cw * ch * 3))
    coarse = coarse.resize((w, h), Image.Resampling.BICUBIC)
    grain = Image.frombytes("L", (w, h), rng.randbytes(w * h)).convert("RGB")
    return Image.blend(coarse, grain, 0.12)


def _encode(img: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=QUALITY)  # type: ignore[attr-defined]
    return buf.getvalue()


def _dims(pixels: float) -> tuple[int, int]:
    h = max(8, int(math.sqrt(pixels / ASPECT)))
    return max(8, int(h * ASPECT)), h


def jpeg(target: int, seed: int, bytes_per_pixel: float = 0.0) -> bytes:
    """A JPEG of about ``target`` bytes: one encode at a size from the bytes per pixel
    (measured on a probe when not given), then one more sized by what that gave."""
    bpp = bytes_per_pixel or probe_bpp()
    rng = random.Random(seed)
    state = rng.getstate()
    data = _encode(_picture(*_dims(target / bpp), rng))
    if abs(len(data) - target) > 0.1 * target:
        bpp = len(data) / math.prod(_dims(target / bpp))
        rng.setstate(state)
        data = _encode(_picture(*_dims(target / bpp), rng))
    return data


def probe_bpp() -> float:
    """Bytes per pixel of this recipe, from one 400x300 picture."""
    return len(_encode(_picture(400, 300, random.Random(-1)))) / (400 * 300)


@dataclass
class ImageSet:
    """``count`` images under ``prefix/``: key -> size, once written."""

    count: int
    seed: int = 7
    prefix: str = "img"
    files: dict[str, int] = field(default_factory=dict)

    def keys(self) -> list[str]:
        return sorted(self.files)

    def key(self, i: int) -> str:
        return f"{self.prefix}/c{i % CLASSES:02d}/i{i:06d}.jpg"

    def write(self, root: Path) -> ImageSet:
        """Write the JPEGs under ``root`` (reused when a marker says they are there)."""
        base = root / self.prefix
        marker = base / f".complete-{self.count}-{self.seed}"
        sizes = target_sizes(self.count, seed=self.seed)
        if marker.exists():
            self.files = {
                self.key(i): (root / self.key(i)).stat().st_size for i in range(self.count)
            }
            return self
        for old in base.glob(".complete-*") if base.exists() else ():
            old.unlink()
        bpp = probe_bpp()
        files = {}
        for i, size in enumerate(sizes):
            p = root / self.key(i)
            p.parent.mkdir(parents=True, exist_ok=True)
            data = jpeg(size, self.seed * 1_000_003 + i, bpp)
            p.write_bytes(data)
            files[self.key(i)] = len(data)
        # a set of another count may have left more files here: none is in this set
        self.files = files
        marker.write_text("ok\n")
        return self

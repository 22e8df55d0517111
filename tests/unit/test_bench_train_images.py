"""The training workload's JPEGs (bench/images.py) and its loop's pure parts
(bench/train.py): size distribution, encoded sizes, class labels, run order, and one
real DataLoader epoch over a few files."""

from __future__ import annotations

import io
import math
import statistics
from pathlib import Path

import pytest

from shoal.bench import images, train


def test_target_sizes_are_log_uniform_in_bounds() -> None:
    sizes = images.target_sizes(4000, seed=1)
    assert min(sizes) >= images.MIN_BYTES and max(sizes) <= images.MAX_BYTES
    logs = [math.log(s) for s in sizes]
    lo, hi = math.log(images.MIN_BYTES), math.log(images.MAX_BYTES)
    # log-uniform: the log's median sits mid-way and each quarter of the log range
    # holds about a quarter of the files
    assert statistics.median(logs) == pytest.approx((lo + hi) / 2, abs=0.1)
    quarter = (hi - lo) / 4
    counts = [
        sum(1 for x in logs if lo + q * quarter <= x < lo + (q + 1) * quarter) for q in range(4)
    ]
    assert all(850 < c < 1150 for c in counts), counts
    assert images.target_sizes(10, seed=1) == images.target_sizes(10, seed=1)
    with pytest.raises(ValueError, match="lo <= hi"):
        images.target_sizes(1, lo=10, hi=5)


@pytest.mark.parametrize("target", [10_000, 120_000, 500_000])
def test_jpeg_is_a_real_jpeg_near_its_target_size(target: int) -> None:
    from PIL import Image

    data = images.jpeg(target, seed=3)
    assert abs(len(data) - target) < 0.25 * target
    with Image.open(io.BytesIO(data)) as im:
        assert im.format == "JPEG"
        w, h = im.size
        # about the bytes per pixel of a camera JPEG, so decoding costs what a photo does
        assert 0.2 < len(data) / (w * h) < 1.5
    assert images.jpeg(target, seed=3) == data  # deterministic


def test_image_set_writes_class_folders_once(tmp_path: Path) -> None:
    s = images.ImageSet(12, seed=2).write(tmp_path)
    assert len(s.files) == 12
    assert {k.split("/")[1] for k in s.files} == {f"c{i:02d}" for i in range(images.CLASSES)}
    for k, size in s.files.items():
        assert (tmp_path / k).stat().st_size == size
    first = (tmp_path / s.keys()[0]).stat().st_mtime_ns
    again = images.ImageSet(12, seed=2).write(tmp_path)  # the marker: nothing rewritten
    assert again.files == s.files
    assert (tmp_path / s.keys()[0]).stat().st_mtime_ns == first


def test_labels_are_the_class_folders() -> None:
    assert train.label_of("img/c03/i000013.jpg") == 3


def test_one_epoch_decodes_every_image(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    s = images.ImageSet(6, seed=4).write(tmp_path)
    keys = tuple(s.keys())
    sizes = tuple(s.files[k] for k in keys)
    loop = train.Loop(workers=2, batch=4, step_ms=0.0)
    got = train.run(train.Source("local-dir", keys, sizes, root=tmp_path), loop, 2)
    assert len(got) == 2
    for sample in got:
        assert sample.files == 6 and sample.nbytes == sum(sizes)
        assert sample.seconds > 0 and sample.cpu_s > 0
    with train.Trainer() as t:  # one child for many requests, alive after a failed one
        missing = train.Source("local-dir", ("img/c00/none.jpg",), (1,), root=tmp_path)
        with pytest.raises(RuntimeError, match="FileNotFoundError"):
            t.run(missing, loop, 1)
        synth = t.run(train.Source("synthetic", keys, sizes), loop, 1)
        assert synth[0].files == 6 and synth[0].nbytes == sum(sizes)
        pid = t.proc.pid
        assert t.run(train.Source("synthetic", keys, sizes), loop, 1)[0].files == 6
        assert t.proc.pid == pid and t.proc.is_alive()
    assert not t.proc.is_alive()

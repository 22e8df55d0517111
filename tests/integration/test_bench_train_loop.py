"""The benchmark's training loop (bench/train.py) over a real cluster and moto: the
ShoalMapDataset loader and the one-GET-per-sample loader decode every JPEG of every
epoch in DataLoader workers, and count the bytes they read."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from shoal.bench import images, train
from shoal.core.types import Mount
from shoal.testing.cluster import TestCluster
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]


def test_shoal_and_raw_get_loaders_read_every_image(
    tmp_path: Path, moto: MotoServer, cluster: TestCluster
) -> None:
    imgs = images.ImageSet(10, seed=5).write(tmp_path)
    make_bucket(moto.endpoint, "bench-img", {k: (tmp_path / k).read_bytes() for k in imgs.files})
    with cluster.client() as cl:
        cl.create_dataset("b", [Mount("data", "s3://bench-img", {"endpoint_url": moto.endpoint})])
    keys = tuple(imgs.keys())
    sizes = tuple(imgs.files[k] for k in keys)
    loop = train.Loop(workers=2, batch=4, step_ms=0.0)
    shoal = train.Source("shoal-torch", keys, sizes, master=cluster.master_url, dataset="b")
    got = train.run(shoal, loop, 2)
    raw = train.run(
        train.Source("boto3", keys, sizes, endpoint=moto.endpoint, bucket="bench-img"), loop, 1
    )
    for s in [*got, *raw]:
        assert s.files == 10 and s.nbytes == sum(sizes) and s.cpu_s > 0

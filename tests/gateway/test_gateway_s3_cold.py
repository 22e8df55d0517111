"""Cold large objects through the S3 gateway, read as boto3's transfer manager reads
them (ranged GETs of a few MiB): every part has the object's bytes, and the gateway
asks the worker whether the whole file is cached (``open_local``, for ``sendfile``)
once, not once per part, while the file is incomplete (``s3_objects.Probes``)."""

from __future__ import annotations

import json
import os
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest

from shoal.testing.s3 import make_bucket

if TYPE_CHECKING:
    from conftest import Gateway, GatewayData
    from shoal.testing.cluster import TestCluster

pytestmark = pytest.mark.integration

MiB = 1 << 20
#: parts larger than the gateway's one-read size (s3_objects.SMALL, 4 MiB): streamed
PART = 5 * MiB


def _locates(cluster: TestCluster) -> float:
    """LOCATE requests the workers have answered (their read latency histogram)."""
    total = 0.0
    for i in range(cluster.workers):
        w = json.loads((cluster.worker_dir(i) / "worker.json").read_text())
        url = f"http://127.0.0.1:{w['metrics_port']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("shoal_read_seconds_count{") and 'op="locate"' in line:
                    total += float(line.rsplit(" ", 1)[1])
    return total


def test_cold_parts_probe_the_whole_file_once(
    s3_gateway: Gateway, s3_client_for: Any, gw_dataset: GatewayData
) -> None:
    cluster, moto = gw_dataset.cluster, gw_dataset.moto
    name = "gw-cold-parts"
    body = os.urandom(4 * PART)
    make_bucket(moto.endpoint, name, {"big.bin": body})
    # no readahead: each part's read is then one LOCATE of its own pages, so the count
    # below is exactly the parts' reads plus the whole-file probes
    cluster.s3_dataset(name, moto.endpoint, {"readahead": "0"}, name=name)
    s3 = s3_client_for(s3_gateway.url, "everyone")
    before = _locates(cluster)
    parts = 3  # under the worker's random-reader rule (a whole fetch after 4 misses)
    for k in reversed(range(parts)):  # backwards: no part's pages were handed over before
        rng = f"bytes={k * PART}-{(k + 1) * PART - 1}"
        got = s3.get_object(Bucket=name, Key="data/big.bin", Range=rng)
        assert got["Body"].read() == body[k * PART : (k + 1) * PART]
    # one probe (it missed: the file is not complete) and one read per part; before,
    # every part probed first: 2 * parts
    assert _locates(cluster) - before == parts + 1


def test_warm_parts_ask_the_worker_once_per_version(
    s3_gateway: Gateway, s3_client_for: Any, gw_dataset: GatewayData
) -> None:
    """A cached large object's parts go out with sendfile from one descriptor, asked
    for once and kept (``LocalFiles``): a whole-file LOCATE costs the worker a lookup
    per page, so one per part cost the square of the object's size."""
    cluster, moto = gw_dataset.cluster, gw_dataset.moto
    name = "gw-warm-parts"
    body = os.urandom(4 * PART)
    make_bucket(moto.endpoint, name, {"big.bin": body})
    cluster.s3_dataset(name, moto.endpoint, name=name)
    with cluster.client() as c:
        assert c.cat(f"/{name}/data/big.bin") == body  # cached whole on its worker
    s3 = s3_client_for(s3_gateway.url, "everyone")
    before = _locates(cluster)
    for _ in range(2):
        for k in range(4):
            rng = f"bytes={k * PART}-{(k + 1) * PART - 1}"
            got = s3.get_object(Bucket=name, Key="data/big.bin", Range=rng)
            assert got["Body"].read() == body[k * PART : (k + 1) * PART]
    assert _locates(cluster) - before == 1  # was one per part: 8

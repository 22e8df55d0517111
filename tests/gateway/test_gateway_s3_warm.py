"""Warm GETs through the S3 gateway: served from the gateway's located pages with no
await (``_read_first_fast``), they must agree with HEAD, honour ranges and
conditions, and never mix versions after an overwrite through the gateway."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from conftest import Gateway, GatewayData


pytestmark = pytest.mark.integration

KEYS = [f"data/000/f{i:06d}.bin" for i in range(10, 16)]


def _status(exc: ClientError) -> int:
    return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])


def test_warm_gets_agree_with_head(
    s3_gateway: Gateway, s3_client_for: Any, gw_dataset: GatewayData
) -> None:
    s3 = s3_client_for(s3_gateway.url, "reader")
    bkt = gw_dataset.bucket
    keys = KEYS
    for _ in range(3):  # cold, then located on the worker, then read with a pread
        for key in keys:
            got = s3.get_object(Bucket=bkt, Key=key)
            assert got["Body"].read() == gw_dataset.files[key]
            assert got["ETag"] == s3.head_object(Bucket=bkt, Key=key)["ETag"]
    key = keys[0]
    want = gw_dataset.files[key]
    assert s3.get_object(Bucket=bkt, Key=key, Range="bytes=3-9")["Body"].read() == want[3:10]
    etag = s3.head_object(Bucket=bkt, Key=key)["ETag"]
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bkt, Key=key, IfNoneMatch=etag)
    assert _status(e.value) == 304
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bkt, Key=key, IfModifiedSince=datetime.now(UTC) + timedelta(days=1))
    assert _status(e.value) == 304
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bkt, Key=key, IfUnmodifiedSince=datetime(2001, 1, 1, tzinfo=UTC))
    assert _status(e.value) == 412


def test_overwrite_of_a_warm_object_is_never_mixed(
    s3_gateway: Gateway, s3_client_for: Any, gw_dataset: GatewayData
) -> None:
    reader = s3_client_for(s3_gateway.url, "reader")
    writer = s3_client_for(s3_gateway.url, "writer")
    bkt, key = gw_dataset.bucket, "data/warm/overwritten.bin"
    old, new = os.urandom(50_000), os.urandom(60_000)
    writer.put_object(Bucket=bkt, Key=key, Body=old)
    for _ in range(3):
        assert reader.get_object(Bucket=bkt, Key=key)["Body"].read() == old
    writer.put_object(Bucket=bkt, Key=key, Body=new)
    got = reader.get_object(Bucket=bkt, Key=key)
    body = got["Body"].read()
    assert body == new
    head = reader.head_object(Bucket=bkt, Key=key)
    assert got["ETag"] == head["ETag"] and head["ContentLength"] == len(new)

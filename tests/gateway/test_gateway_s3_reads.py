"""The S3 gateway's read side with boto3 against a real cluster: objects (HEAD, GET,
ranges, conditions), listings (v2 and v1 with every parameter, >1000 keys), buckets
and the sub-resources clients probe, presigned URLs, metrics."""

from __future__ import annotations

import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import pytest
from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from conftest import Gateway, GatewayData


pytestmark = pytest.mark.integration

SMALL = "data/000/f000003.bin"
LARGE = "data/big/large.bin"
ODD = "data/odd/sp ace+plus%pct ü.txt"


@pytest.fixture(scope="module")
def s3(s3_gateway: Gateway, s3_client_for: Any) -> Any:
    return s3_client_for(s3_gateway.url, "reader")


def code_of(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


def test_head_and_get_agree(s3: Any, gw_dataset: GatewayData) -> None:
    bkt = gw_dataset.bucket
    for key in (SMALL, LARGE, ODD):
        head = s3.head_object(Bucket=bkt, Key=key)
        got = s3.get_object(Bucket=bkt, Key=key)
        body = got["Body"].read()
        assert body == gw_dataset.files[key]
        assert head["ContentLength"] == len(body) == got["ContentLength"]
        assert head["ETag"] == got["ETag"] and head["ETag"].startswith('"')
        assert head["LastModified"] == got["LastModified"]
        assert head["LastModified"].year >= 2025
    listed = s3.list_objects_v2(Bucket=bkt, Prefix=SMALL)["Contents"]
    assert [o["Key"] for o in listed] == [SMALL]
    assert listed[0]["ETag"] == s3.head_object(Bucket=bkt, Key=SMALL)["ETag"]
    assert listed[0]["Size"] == len(gw_dataset.files[SMALL])


def test_large_get_twice_is_the_same(s3: Any, gw_dataset: GatewayData) -> None:
    want = gw_dataset.files[LARGE]
    for _ in range(2):  # cold (streamed through client.read), then warm (sendfile)
        assert s3.get_object(Bucket=gw_dataset.bucket, Key=LARGE)["Body"].read() == want


@pytest.mark.parametrize(
    "rng, sl",
    [
        ("bytes=0-9", slice(0, 10)),
        ("bytes=10-", slice(10, None)),
        ("bytes=-7", slice(-7, None)),
        ("bytes=5-99999999", slice(5, None)),
    ],
)
def test_ranges(s3: Any, gw_dataset: GatewayData, rng: str, sl: slice) -> None:
    want = gw_dataset.files[SMALL]
    got = s3.get_object(Bucket=gw_dataset.bucket, Key=SMALL, Range=rng)
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    body = got["Body"].read()
    assert body == want[sl]
    start = sl.start if sl.start >= 0 else len(want) + sl.start
    assert got["ContentRange"] == f"bytes {start}-{start + len(body) - 1}/{len(want)}"


def test_large_range_crosses_chunks(s3: Any, gw_dataset: GatewayData) -> None:
    want = gw_dataset.files[LARGE]
    rng = f"bytes={(1 << 20) + 5}-{(8 << 20) + 17}"
    got = s3.get_object(Bucket=gw_dataset.bucket, Key=LARGE, Range=rng)
    assert got["Body"].read() == want[(1 << 20) + 5 : (8 << 20) + 18]


def test_unsatisfiable_range_is_416(s3: Any, gw_dataset: GatewayData) -> None:
    size = len(gw_dataset.files[SMALL])
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=gw_dataset.bucket, Key=SMALL, Range=f"bytes={size + 10}-")
    assert code_of(e.value) == (416, "InvalidRange")


def test_conditions(s3: Any, gw_dataset: GatewayData) -> None:
    bkt = gw_dataset.bucket
    etag = s3.head_object(Bucket=bkt, Key=SMALL)["ETag"]
    assert s3.get_object(Bucket=bkt, Key=SMALL, IfMatch=etag)["Body"].read()
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bkt, Key=SMALL, IfMatch='"0123"')
    assert code_of(e.value)[0] == 412
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bkt, Key=SMALL, IfNoneMatch=etag)
    assert code_of(e.value)[0] == 304
    assert s3.get_object(Bucket=bkt, Key=SMALL, IfNoneMatch='"other"')["Body"].read()
    future = datetime.now(UTC) + timedelta(days=1)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bkt, Key=SMALL, IfModifiedSince=future)
    assert code_of(e.value)[0] == 304
    past = datetime(2001, 1, 1, tzinfo=UTC)
    assert s3.get_object(Bucket=bkt, Key=SMALL, IfModifiedSince=past)["Body"].read()
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bkt, Key=SMALL, IfUnmodifiedSince=past)
    assert code_of(e.value)[0] == 412


def test_missing_key_and_bucket(
    s3: Any, gw_dataset: GatewayData, s3_gateway: Gateway, s3_client_for: Any
) -> None:
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=gw_dataset.bucket, Key="data/nope.bin")
    assert code_of(e.value) == (404, "NoSuchKey")
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=gw_dataset.bucket, Key="data/000")  # a directory
    assert code_of(e.value) == (404, "NoSuchKey")
    everyone = s3_client_for(s3_gateway.url, "everyone")
    with pytest.raises(ClientError) as e:
        everyone.list_objects_v2(Bucket="no-such-dataset")
    assert code_of(e.value) == (404, "NoSuchBucket")
    with pytest.raises(ClientError) as e:  # scoped: not told whether it exists
        s3.list_objects_v2(Bucket="no-such-dataset")
    assert code_of(e.value) == (403, "AccessDenied")


def _all_keys(s3: Any, bucket: str, **kw: Any) -> tuple[list[str], list[str], int]:
    keys: list[str] = []
    prefixes: list[str] = []
    pages = 0
    token: str | None = None
    while True:
        args = dict(kw, Bucket=bucket)
        if token:
            args["ContinuationToken"] = token
        r = s3.list_objects_v2(**args)
        pages += 1
        keys += [o["Key"] for o in r.get("Contents", [])]
        prefixes += [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        assert r["KeyCount"] == len(r.get("Contents", [])) + len(r.get("CommonPrefixes", []))
        if not r["IsTruncated"]:
            return keys, prefixes, pages
        token = r["NextContinuationToken"]


def test_list_v2(s3: Any, gw_dataset: GatewayData) -> None:
    bkt, files = gw_dataset.bucket, gw_dataset.files
    keys, prefixes, _ = _all_keys(s3, bkt, Delimiter="/")
    assert (keys, prefixes) == ([], ["data/"])
    keys, prefixes, _ = _all_keys(s3, bkt, Prefix="data/", Delimiter="/")
    assert keys == [] and prefixes == ["data/000/", "data/big/", "data/odd/"]
    keys, prefixes, pages = _all_keys(s3, bkt, MaxKeys=7)
    assert keys == sorted(files) and not prefixes and pages == -(-len(files) // 7)
    keys, prefixes, pages = _all_keys(s3, bkt, Prefix="data/", Delimiter="/", MaxKeys=1)
    assert prefixes == ["data/000/", "data/big/", "data/odd/"] and pages == 3
    keys, _, _ = _all_keys(s3, bkt, Prefix="data/000/f00001")
    assert keys == sorted(k for k in files if k.startswith("data/000/f00001"))
    keys, _, _ = _all_keys(s3, bkt, StartAfter="data/000/f000050.bin")
    assert keys == sorted(k for k in files if k > "data/000/f000050.bin")
    keys, prefixes, _ = _all_keys(s3, bkt, StartAfter="data/000/", Prefix="data/", Delimiter="/")
    assert prefixes == ["data/big/", "data/odd/"]
    r = s3.list_objects_v2(Bucket=bkt, Prefix="data/odd/", EncodingType="url")
    # asked for explicitly, botocore leaves the decoding to the caller
    assert [o["Key"] for o in r["Contents"]] == [quote(ODD, safe="/")]
    assert r["EncodingType"] == "url" and unquote(r["Prefix"]) == "data/odd/"
    r = s3.list_objects_v2(Bucket=bkt, Prefix="data/odd/")  # botocore asks and decodes
    assert [o["Key"] for o in r["Contents"]] == [ODD]
    assert s3.list_objects_v2(Bucket=bkt, MaxKeys=0)["KeyCount"] == 0
    r = s3.list_objects_v2(
        Bucket=bkt, Prefix="data/big/", OptionalObjectAttributes=["RestoreStatus"]
    )
    assert [o["Key"] for o in r["Contents"]] == [LARGE]
    with pytest.raises(ClientError) as e:
        s3.list_objects_v2(Bucket=bkt, ContinuationToken="not-a-token")
    assert code_of(e.value) == (400, "InvalidArgument")


def test_list_v1(s3: Any, gw_dataset: GatewayData) -> None:
    bkt, files = gw_dataset.bucket, gw_dataset.files
    keys: list[str] = []
    marker = ""
    while True:
        r = s3.list_objects(Bucket=bkt, Marker=marker, MaxKeys=25)
        keys += [o["Key"] for o in r.get("Contents", [])]
        if not r["IsTruncated"]:
            break
        marker = r.get("NextMarker") or keys[-1]
    assert keys == sorted(files)
    r = s3.list_objects(Bucket=bkt, Prefix="data/", Delimiter="/", MaxKeys=2)
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["data/000/", "data/big/"]
    assert r["IsTruncated"] and r["NextMarker"] == "data/big/"
    r = s3.list_objects(Bucket=bkt, Prefix="data/", Delimiter="/", Marker=r["NextMarker"])
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["data/odd/"]


@pytest.fixture(scope="module")
def many(gw_dataset: GatewayData, seed: Any) -> GatewayData:
    files = {f"k/{i:05d}": b"x" for i in range(1010)}
    return seed(gw_dataset.cluster, gw_dataset.moto, "gw-many", files)


def test_list_over_1000_keys(s3_gateway: Gateway, many: GatewayData, s3_client_for: Any) -> None:
    s3 = s3_client_for(s3_gateway.url, "everyone")
    r = s3.list_objects_v2(Bucket=many.bucket)
    assert r["KeyCount"] == 1000 and r["IsTruncated"] and r["MaxKeys"] == 1000
    keys, _, pages = _all_keys(s3, many.bucket)
    assert keys == sorted(many.files) and pages == 2
    paginator = s3.get_paginator("list_objects")
    got = [o["Key"] for page in paginator.paginate(Bucket=many.bucket) for o in page["Contents"]]
    assert got == sorted(many.files)


def test_buckets_and_probes(
    s3: Any, gw_dataset: GatewayData, s3_gateway: Gateway, s3_client_for: Any
) -> None:
    bkt = gw_dataset.bucket
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == [bkt]
    listed = s3_client_for(s3_gateway.url, "everyone").list_buckets()["Buckets"]
    everyone = [b["Name"] for b in listed]
    assert bkt in everyone
    assert s3.head_bucket(Bucket=bkt)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert s3.get_bucket_location(Bucket=bkt)["LocationConstraint"] is None
    assert s3.get_bucket_acl(Bucket=bkt)["Grants"][0]["Permission"] == "FULL_CONTROL"
    assert "Status" not in s3.get_bucket_versioning(Bucket=bkt)
    for probe, code in (
        (s3.get_bucket_policy, "NoSuchBucketPolicy"),
        (s3.get_bucket_cors, "NoSuchCORSConfiguration"),
    ):
        with pytest.raises(ClientError) as e:
            probe(Bucket=bkt)
        assert code_of(e.value) == (404, code)
    assert s3.get_object_acl(Bucket=bkt, Key=SMALL)["Grants"]


def test_presigned_v4_and_v2(
    s3_gateway: Gateway, gw_dataset: GatewayData, s3_client_for: Any
) -> None:
    want = gw_dataset.files[SMALL]
    for version in ("s3v4", "s3"):
        c = s3_client_for(s3_gateway.url, "reader", signature_version=version)
        url = c.generate_presigned_url(
            "get_object", Params={"Bucket": gw_dataset.bucket, "Key": SMALL}, ExpiresIn=300
        )
        assert ("X-Amz-Signature" in url) == (version == "s3v4")
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.read() == want
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url.replace(SMALL.split("/")[-1], "f000004.bin"), timeout=10)
        assert e.value.code == 403 and b"SignatureDoesNotMatch" in e.value.read()


def test_metrics(s3_gateway: Gateway, s3: Any, gw_dataset: GatewayData) -> None:
    s3.get_object(Bucket=gw_dataset.bucket, Key=SMALL)["Body"].read()
    with urllib.request.urlopen(s3_gateway.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'shoal_gateway_requests_total{gateway="s3",op="GetObject",status="200"}' in text
    assert 'shoal_gateway_bytes_total{gateway="s3",op="GetObject"}' in text
    assert 'shoal_gateway_request_seconds_bucket{gateway="s3",le="0.005",op="GetObject"}' in text


def test_gateway_refuses_to_start_without_credentials(
    gw_dataset: GatewayData, capsys: pytest.CaptureFixture[str]
) -> None:
    from shoal.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["gateway", "s3", "--master", gw_dataset.cluster.master_url, "--port", "0"])
    assert e.value.code == 2 and "--credentials" in capsys.readouterr().err


@pytest.fixture(scope="module")
def bare(gw_dataset: GatewayData, seed: Any) -> GatewayData:
    """A dataset without a manifest (no metadata load)."""
    files = {f"d{i % 3}/sub{i % 2}/f{i:03d}": bytes([i]) * (i + 1) for i in range(30)}
    files["top.bin"] = b"top"
    ds: GatewayData = seed(gw_dataset.cluster, gw_dataset.moto, "gw-bare", files, manifest=False)
    return ds


def test_listing_without_a_manifest(
    s3_gateway: Gateway, bare: GatewayData, s3_client_for: Any
) -> None:
    s3 = s3_client_for(s3_gateway.url, "everyone")
    bkt, files = bare.bucket, bare.files
    keys, prefixes, _ = _all_keys(s3, bkt, Prefix="data/", Delimiter="/")
    assert keys == ["data/top.bin"] and prefixes == ["data/d0/", "data/d1/", "data/d2/"]
    keys, prefixes, _ = _all_keys(s3, bkt, Prefix="data/d1/", Delimiter="/")
    assert keys == [] and prefixes == ["data/d1/sub0/", "data/d1/sub1/"]
    keys, _, pages = _all_keys(s3, bkt, MaxKeys=7)
    assert keys == sorted(files) and pages == -(-len(files) // 7)
    keys, _, _ = _all_keys(s3, bkt, Prefix="data/d2/sub")
    assert keys == sorted(k for k in files if k.startswith("data/d2/sub"))
    key = "data/d0/sub1/f003"
    got = s3.get_object(Bucket=bkt, Key=key)
    assert got["Body"].read() == files[key]
    assert got["ETag"] == s3.list_objects_v2(Bucket=bkt, Prefix=key)["Contents"][0]["ETag"]

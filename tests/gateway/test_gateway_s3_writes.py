"""Writes through the S3 gateway (checkpoints): PutObject and read-after-write,
multipart upload, aws-chunked bodies over TLS, DeleteObject, CopyObject, DeleteObjects,
read-only datasets."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from shoal.testing.s3 import s3_client

if TYPE_CHECKING:
    from conftest import Gateway, GatewayData

pytestmark = pytest.mark.integration

MiB = 1 << 20


def code_of(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


@pytest.fixture(scope="module")
def readonly(gw_dataset: GatewayData, seed: Any) -> GatewayData:
    ds: GatewayData = seed(gw_dataset.cluster, gw_dataset.moto, "gw-readonly", {"a.bin": b"ro"})
    return ds


@pytest.fixture(scope="module")
def gw(
    gw_dataset: GatewayData,
    readonly: GatewayData,
    tls: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
    gwkit: Any,
) -> Iterator[Gateway]:
    """An HTTPS gateway: writer may write both datasets, only gw_dataset is --writable."""
    d = tmp_path_factory.mktemp("s3w")
    both = [gw_dataset.dataset, readonly.dataset]
    creds = gwkit.write_credentials(d / "c.toml", {"reader": both, "writer": both})
    cert, key = tls
    args = ["--credentials", str(creds), "--writable", gw_dataset.dataset, "--spool-dir", str(d)]
    args += ["--tls-cert", str(cert), "--tls-key", str(key)]
    url, proc = gwkit.start_gateway("s3", gw_dataset.cluster.master_url, args, d / "log")
    try:
        yield gwkit.Gateway(url, proc, creds, d / "log")
    finally:
        gwkit.stop_gateway(proc)


@pytest.fixture(scope="module")
def writer(gw: Gateway, tls: tuple[Path, Path], s3_client_for: Any) -> Any:
    assert gw.url.startswith("https://")
    return s3_client_for(gw.url, "writer", verify=str(tls[0]))


def test_put_then_read_new_bytes(writer: Any, gw_dataset: GatewayData) -> None:
    bkt, key = gw_dataset.bucket, "data/000/f000001.bin"
    old = gw_dataset.files[key]
    assert writer.get_object(Bucket=bkt, Key=key)["Body"].read() == old  # warm: cached
    old_etag = writer.head_object(Bucket=bkt, Key=key)["ETag"]
    new = os.urandom(200_000)
    t0 = time.monotonic()
    put = writer.put_object(Bucket=bkt, Key=key, Body=new)  # https: aws-chunked + trailer
    took = time.monotonic() - t0
    assert writer.get_object(Bucket=bkt, Key=key)["Body"].read() == new
    head = writer.head_object(Bucket=bkt, Key=key)
    assert head["ETag"] == put["ETag"] != old_etag and head["ContentLength"] == len(new)
    listed = writer.list_objects_v2(Bucket=bkt, Prefix=key)["Contents"]
    assert [(o["Key"], o["Size"], o["ETag"]) for o in listed] == [(key, len(new), put["ETag"])]
    with gw_dataset.cluster.client() as c:  # every reader of the cache sees it
        assert c.read(f"/{bkt}/{key}") == new
    assert took < 30


def test_put_new_key_and_delete(writer: Any, gw_dataset: GatewayData) -> None:
    bkt, key = gw_dataset.bucket, "data/ckpt/step-1/model.pt"
    body = b"weights" * 1000
    writer.put_object(Bucket=bkt, Key=key, Body=body, ContentMD5=_md5(body))
    assert writer.get_object(Bucket=bkt, Key=key)["Body"].read() == body
    prefixes = writer.list_objects_v2(Bucket=bkt, Prefix="data/", Delimiter="/")["CommonPrefixes"]
    assert "data/ckpt/" in [p["Prefix"] for p in prefixes]
    writer.delete_object(Bucket=bkt, Key=key)
    with pytest.raises(ClientError) as e:
        writer.get_object(Bucket=bkt, Key=key)
    assert code_of(e.value) == (404, "NoSuchKey")
    with pytest.raises(ClientError) as e:
        writer.put_object(Bucket=bkt, Key="data/x.bin", Body=b"abc", ContentMD5=_md5(b"abd"))
    assert code_of(e.value) == (400, "BadDigest")


def _md5(b: bytes) -> str:
    import base64
    import hashlib

    return base64.b64encode(hashlib.md5(b).digest()).decode()


def test_multipart_by_hand(writer: Any, gw_dataset: GatewayData) -> None:
    bkt, key = gw_dataset.bucket, "data/ckpt/big.bin"
    parts = [os.urandom(5 * MiB), os.urandom(1234)]
    up = writer.create_multipart_upload(Bucket=bkt, Key=key)["UploadId"]
    etags = [
        writer.upload_part(Bucket=bkt, Key=key, UploadId=up, PartNumber=i + 1, Body=p)["ETag"]
        for i, p in enumerate(parts)
    ]
    listed = writer.list_parts(Bucket=bkt, Key=key, UploadId=up)["Parts"]
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in listed] == [
        (1, 5 * MiB, etags[0]),
        (2, 1234, etags[1]),
    ]
    uploads = writer.list_multipart_uploads(Bucket=bkt)["Uploads"]
    assert up in [u["UploadId"] for u in uploads]
    with pytest.raises(ClientError) as e:
        writer.complete_multipart_upload(
            Bucket=bkt, Key=key, UploadId=up,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"0000"'}]},
        )  # fmt: skip
    assert code_of(e.value) == (400, "InvalidPart")
    done = writer.complete_multipart_upload(
        Bucket=bkt, Key=key, UploadId=up,
        MultipartUpload={"Parts": [{"PartNumber": i + 1, "ETag": t} for i, t in enumerate(etags)]},
    )  # fmt: skip
    got = writer.get_object(Bucket=bkt, Key=key)
    assert got["Body"].read() == b"".join(parts) and got["ETag"] == done["ETag"]
    with pytest.raises(ClientError) as e:
        writer.list_parts(Bucket=bkt, Key=key, UploadId=up)
    assert code_of(e.value) == (404, "NoSuchUpload")


def test_multipart_abort_and_small_parts(writer: Any, gw_dataset: GatewayData) -> None:
    bkt, key = gw_dataset.bucket, "data/ckpt/aborted.bin"
    up = writer.create_multipart_upload(Bucket=bkt, Key=key)["UploadId"]
    etags = [
        writer.upload_part(Bucket=bkt, Key=key, UploadId=up, PartNumber=n, Body=b"x" * 10)["ETag"]
        for n in (1, 2)
    ]
    with pytest.raises(ClientError) as e:
        writer.complete_multipart_upload(
            Bucket=bkt, Key=key, UploadId=up,
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": t} for n, t in zip((1, 2), etags, strict=True)]},
        )  # fmt: skip
    assert code_of(e.value) == (400, "EntityTooSmall")
    writer.abort_multipart_upload(Bucket=bkt, Key=key, UploadId=up)
    with pytest.raises(ClientError) as e:
        writer.upload_part(Bucket=bkt, Key=key, UploadId=up, PartNumber=3, Body=b"x")
    assert code_of(e.value) == (404, "NoSuchUpload")
    with pytest.raises(ClientError) as e:
        writer.get_object(Bucket=bkt, Key=key)
    assert code_of(e.value) == (404, "NoSuchKey")


def _signed_post(url: str, path: str, body: bytes, cafile: Path, key: tuple[str, str]) -> Any:
    import http.client
    import ssl
    from urllib.parse import urlsplit

    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCredentials

    req = AWSRequest(method="POST", url=url + path, data=body)
    req.headers["X-Amz-Content-SHA256"] = "UNSIGNED-PAYLOAD"
    S3SigV4Auth(BotoCredentials(*key), "s3", "us-east-1").add_auth(req)
    u = urlsplit(url)
    ctx = ssl.create_default_context(cafile=str(cafile))
    conn = http.client.HTTPSConnection(u.hostname or "", u.port, timeout=10, context=ctx)
    try:
        conn.request("POST", path, body=body, headers=dict(req.headers.items()))
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_malformed_complete_xml(
    gw: Gateway, writer: Any, gw_dataset: GatewayData, tls: Any, gwkit: Any
) -> None:
    bkt, key = gw_dataset.bucket, "data/ckpt/malformed.bin"
    up = writer.create_multipart_upload(Bucket=bkt, Key=key)["UploadId"]
    for body in (
        b"<CompleteMultipartUpload><Part>",
        b"<?xml version='1.0'?><!DOCTYPE x [<!ENTITY a 'b'>]><x>&a;</x>",
        b"<Other/>",
    ):
        status, answer = _signed_post(
            gw.url, f"/{bkt}/{key}?uploadId={up}", body, tls[0], gwkit.KEYS["writer"]
        )
        assert status == 400 and b"<Code>MalformedXML</Code>" in answer, answer
    writer.abort_multipart_upload(Bucket=bkt, Key=key, UploadId=up)


def test_upload_file_and_download(writer: Any, gw_dataset: GatewayData, tmp_path: Path) -> None:
    src, dst = tmp_path / "src.bin", tmp_path / "dst.bin"
    src.write_bytes(os.urandom(11 * MiB))
    cfg = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    writer.upload_file(str(src), gw_dataset.bucket, "data/ckpt/s3transfer.bin", Config=cfg)
    writer.download_file(gw_dataset.bucket, "data/ckpt/s3transfer.bin", str(dst), Config=cfg)
    assert dst.read_bytes() == src.read_bytes()
    # again, now cached: over TLS a local file goes out in preads instead of sendfile
    got = writer.get_object(Bucket=gw_dataset.bucket, Key="data/ckpt/s3transfer.bin")
    assert got["Body"].read() == src.read_bytes()


def test_read_only_dataset_refuses_writes(writer: Any, readonly: GatewayData) -> None:
    assert writer.get_object(Bucket=readonly.bucket, Key="data/a.bin")["Body"].read() == b"ro"
    for call in (
        lambda: writer.put_object(Bucket=readonly.bucket, Key="data/a.bin", Body=b"new"),
        lambda: writer.create_multipart_upload(Bucket=readonly.bucket, Key="data/b.bin"),
        lambda: writer.delete_object(Bucket=readonly.bucket, Key="data/a.bin"),
    ):
        with pytest.raises(ClientError) as e:
            call()
        assert code_of(e.value) == (403, "AccessDenied")
    assert writer.get_object(Bucket=readonly.bucket, Key="data/a.bin")["Body"].read() == b"ro"


def test_reader_may_not_write(
    gw: Gateway, gw_dataset: GatewayData, tls: Any, s3_client_for: Any
) -> None:
    reader = s3_client_for(gw.url, "reader", verify=str(tls[0]))
    with pytest.raises(ClientError) as e:
        reader.put_object(Bucket=gw_dataset.bucket, Key="data/x.bin", Body=b"x")
    assert code_of(e.value) == (403, "AccessDenied")


def _sync_jobs(gw_dataset: GatewayData) -> int:
    with gw_dataset.cluster.client() as c:
        return sum(1 for j in c.jobs()["jobs"] if j["kind"] == "sync")


def test_copy_object(writer: Any, gw_dataset: GatewayData, readonly: GatewayData) -> None:
    bkt, src = gw_dataset.bucket, "data/000/f000002.bin"
    body = gw_dataset.files[src]
    got = writer.copy_object(Bucket=bkt, Key="data/copies/a.bin", CopySource={"Bucket": bkt, "Key": src})  # fmt: skip
    etag = got["CopyObjectResult"]["ETag"]
    assert writer.get_object(Bucket=bkt, Key="data/copies/a.bin")["Body"].read() == body
    assert writer.head_object(Bucket=bkt, Key="data/copies/a.bin")["ETag"] == etag
    # the copy is in under storage too, not only in the cache
    store = s3_client(gw_dataset.moto.endpoint)  # the mount "data" is the bucket's root
    assert store.get_object(Bucket=bkt, Key="copies/a.bin")["Body"].read() == body
    # from a dataset the caller may only read, into a writable one
    writer.copy_object(Bucket=bkt, Key="data/copies/ro.bin", CopySource=f"{readonly.bucket}/data/a.bin")  # fmt: skip
    assert writer.get_object(Bucket=bkt, Key="data/copies/ro.bin")["Body"].read() == b"ro"
    # conditions on the source
    src_etag = writer.head_object(Bucket=bkt, Key=src)["ETag"]
    writer.copy_object(Bucket=bkt, Key="data/copies/b.bin", CopySource={"Bucket": bkt, "Key": src}, CopySourceIfMatch=src_etag)  # fmt: skip
    same = {"Bucket": bkt, "Key": src}
    refusals = [
        ((412, "PreconditionFailed"), {"Key": "data/copies/c.bin", "CopySource": same, "CopySourceIfMatch": '"nope"'}),
        ((412, "PreconditionFailed"), {"Key": "data/copies/c.bin", "CopySource": same, "CopySourceIfNoneMatch": src_etag}),
        ((404, "NoSuchKey"), {"Key": "data/copies/c.bin", "CopySource": {"Bucket": bkt, "Key": "data/none.bin"}}),
        ((400, "InvalidRequest"), {"Key": src, "CopySource": same}),  # onto itself
        ((403, "AccessDenied"), {"Bucket": readonly.bucket, "Key": "data/x.bin", "CopySource": same}),
    ]  # fmt: skip
    for want, kwargs in refusals:
        with pytest.raises(ClientError) as e:
            writer.copy_object(**{"Bucket": bkt, **kwargs})
        assert code_of(e.value) == want, kwargs
    with pytest.raises(ClientError) as e:
        writer.head_object(Bucket=bkt, Key="data/copies/c.bin")
    assert code_of(e.value)[0] == 404
    # onto itself with new metadata is allowed (S3's way to "touch" an object)
    writer.copy_object(Bucket=bkt, Key="data/copies/a.bin", CopySource={"Bucket": bkt, "Key": "data/copies/a.bin"}, MetadataDirective="REPLACE")  # fmt: skip
    assert writer.get_object(Bucket=bkt, Key="data/copies/a.bin")["Body"].read() == body


def test_delete_objects_in_one_sync(writer: Any, gw_dataset: GatewayData) -> None:
    bkt = gw_dataset.bucket
    keys = [f"data/batch/k{i}.bin" for i in range(5)]
    for k in keys:
        writer.put_object(Bucket=bkt, Key=k, Body=k.encode())
        assert writer.get_object(Bucket=bkt, Key=k)["Body"].read() == k.encode()  # cached
    before = _sync_jobs(gw_dataset)
    objects = [{"Key": k} for k in [*keys, "data/batch/never-there.bin", "data/../x.bin"]]
    r = writer.delete_objects(Bucket=bkt, Delete={"Objects": objects})
    assert sorted(d["Key"] for d in r["Deleted"]) == sorted([*keys, "data/batch/never-there.bin"])
    assert [(e["Key"], e["Code"]) for e in r.get("Errors", [])] == [("data/../x.bin", "NoSuchKey")]  # fmt: skip
    assert _sync_jobs(gw_dataset) == before + 1  # one sync job for the whole batch
    for k in keys:
        with pytest.raises(ClientError) as e:
            writer.get_object(Bucket=bkt, Key=k)
        assert code_of(e.value) == (404, "NoSuchKey")
    assert "Contents" not in writer.list_objects_v2(Bucket=bkt, Prefix="data/batch/")
    # Quiet: only the errors come back
    writer.put_object(Bucket=bkt, Key="data/batch/q.bin", Body=b"q")
    r = writer.delete_objects(Bucket=bkt, Delete={"Objects": [{"Key": "data/batch/q.bin"}], "Quiet": True})  # fmt: skip
    assert "Deleted" not in r and "Errors" not in r
    with pytest.raises(ClientError) as e:
        writer.head_object(Bucket=bkt, Key="data/batch/q.bin")
    assert code_of(e.value)[0] == 404


def test_delete_objects_refusals(writer: Any, readonly: GatewayData, gw: Gateway) -> None:
    with pytest.raises(ClientError) as e:
        writer.delete_objects(Bucket=readonly.bucket, Delete={"Objects": [{"Key": "data/a.bin"}]})
    assert code_of(e.value) == (403, "AccessDenied")
    assert writer.get_object(Bucket=readonly.bucket, Key="data/a.bin")["Body"].read() == b"ro"
    too_many = [{"Key": f"data/k{i}"} for i in range(1001)]
    with pytest.raises(ClientError) as e:
        writer.delete_objects(Bucket=readonly.bucket, Delete={"Objects": too_many})
    assert code_of(e.value)[0] in (400, 403)

"""Multipart uploads shared by gateway processes (one --uploads-dir): an upload goes on
after its gateway is SIGKILLed, two gateways serve alternate parts, ListParts and
ListMultipartUploads agree, abort cleans up, another identity is refused; and
UploadPartCopy (from a cached object, with ranges, through boto3's managed copy)."""

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
RIVAL = ("AKIDRIVAL", "rival-secret-0123456789")


def code_of(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


class Gateways:
    """Gateway processes over one dataset that share one uploads directory."""

    def __init__(self, gw_dataset: GatewayData, d: Path, gwkit: Any) -> None:
        self.data, self.d, self.kit = gw_dataset, d, gwkit
        self.uploads = d / "uploads"
        ds = gw_dataset.dataset
        self.creds = gwkit.write_credentials(d / "c.toml", {"reader": [ds], "writer": [ds]})
        with open(self.creds, "a") as f:  # a second identity that may write the dataset
            f.write(
                f'[users.rival]\nrole = "write"\ndatasets = ["{ds}"]\n'
                f'keys = [{{ access_key = "{RIVAL[0]}", secret = "{RIVAL[1]}" }}]\n'
            )
        self.started: list[Gateway] = []

    def start(self, name: str, *extra: str) -> Gateway:
        (self.d / name).mkdir()
        args = ["--credentials", str(self.creds), "--writable", self.data.dataset]
        args += ["--spool-dir", str(self.d / name), "--uploads-dir", str(self.uploads), *extra]
        log = self.d / f"{name}.log"
        url, proc = self.kit.start_gateway("s3", self.data.cluster.master_url, args, log)
        gw: Gateway = self.kit.Gateway(url, proc, self.creds, log)
        self.started.append(gw)
        return gw

    def stop(self) -> None:
        for gw in self.started:
            if gw.proc.poll() is None:
                self.kit.stop_gateway(gw.proc)


@pytest.fixture(scope="module")
def gws(
    gw_dataset: GatewayData, tmp_path_factory: pytest.TempPathFactory, gwkit: Any
) -> Iterator[Gateways]:
    g = Gateways(gw_dataset, tmp_path_factory.mktemp("s3mp"), gwkit)
    try:
        yield g
    finally:
        g.stop()


@pytest.fixture(scope="module")
def a(gws: Gateways) -> Gateway:
    return gws.start("a")


@pytest.fixture(scope="module")
def b(gws: Gateways) -> Gateway:
    return gws.start("b")


@pytest.fixture(scope="module")
def wa(a: Gateway, s3_client_for: Any) -> Any:
    return s3_client_for(a.url, "writer")


@pytest.fixture(scope="module")
def wb(b: Gateway, s3_client_for: Any) -> Any:
    return s3_client_for(b.url, "writer")


def _parts(client: Any, bkt: str, key: str, up: str) -> list[tuple[int, int, str]]:
    listed = client.list_parts(Bucket=bkt, Key=key, UploadId=up).get("Parts", [])
    return [(p["PartNumber"], p["Size"], p["ETag"]) for p in listed]


def _complete(client: Any, bkt: str, key: str, up: str, etags: list[str]) -> Any:
    parts = [{"PartNumber": i + 1, "ETag": t} for i, t in enumerate(etags)]
    return client.complete_multipart_upload(
        Bucket=bkt, Key=key, UploadId=up, MultipartUpload={"Parts": parts}
    )


def _store_bytes(gw_dataset: GatewayData, key: str) -> bytes:
    """The object straight from the under store (mount "data" is the bucket's root)."""
    rel = key.removeprefix("data/")
    got: bytes = (
        s3_client(gw_dataset.moto.endpoint)
        .get_object(Bucket=gw_dataset.bucket, Key=rel)["Body"]
        .read()
    )
    return got


def test_upload_goes_on_after_sigkill(
    gws: Gateways, wb: Any, b: Gateway, gw_dataset: GatewayData, s3_client_for: Any
) -> None:
    bkt, key = gw_dataset.bucket, "data/ckpt/killed.bin"
    k = gws.start("k")
    wk = s3_client_for(k.url, "writer")
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(777)]
    up = wk.create_multipart_upload(Bucket=bkt, Key=key)["UploadId"]
    etags = [wk.upload_part(Bucket=bkt, Key=key, UploadId=up, PartNumber=1, Body=parts[0])["ETag"]]
    k.proc.kill()  # SIGKILL: nothing of the upload is left in any process
    k.proc.wait(10)
    for n in (2, 3):
        r = wb.upload_part(Bucket=bkt, Key=key, UploadId=up, PartNumber=n, Body=parts[n - 1])
        etags.append(r["ETag"])
    assert _parts(wb, bkt, key, up) == [(i + 1, len(p), etags[i]) for i, p in enumerate(parts)]
    done = _complete(wb, bkt, key, up, etags)
    whole = b"".join(parts)
    got = wb.get_object(Bucket=bkt, Key=key)
    assert got["Body"].read() == whole and got["ETag"] == done["ETag"]
    assert _store_bytes(gw_dataset, key) == whole
    assert not (gws.uploads / up).exists()
    with pytest.raises(ClientError) as e:
        wb.list_parts(Bucket=bkt, Key=key, UploadId=up)
    assert code_of(e.value) == (404, "NoSuchUpload")


def test_two_gateways_serve_alternate_parts(
    wa: Any, wb: Any, gw_dataset: GatewayData, gws: Gateways
) -> None:
    bkt, key = gw_dataset.bucket, "data/ckpt/alternate.bin"
    parts = [os.urandom(5 * MiB) for _ in range(3)] + [os.urandom(4321)]
    up = wa.create_multipart_upload(Bucket=bkt, Key=key)["UploadId"]
    etags = []
    for i, body in enumerate(parts):
        client = (wa, wb)[i % 2]
        etags.append(
            client.upload_part(Bucket=bkt, Key=key, UploadId=up, PartNumber=i + 1, Body=body)[
                "ETag"
            ]
        )
    want = [(i + 1, len(p), etags[i]) for i, p in enumerate(parts)]
    assert _parts(wa, bkt, key, up) == _parts(wb, bkt, key, up) == want
    page = wb.list_parts(Bucket=bkt, Key=key, UploadId=up, MaxParts=2)
    assert [p["PartNumber"] for p in page["Parts"]] == [1, 2] and page["IsTruncated"]
    listed = [
        [(u["Key"], u["UploadId"]) for u in c.list_multipart_uploads(Bucket=bkt)["Uploads"]]
        for c in (wa, wb)
    ]
    assert listed[0] == listed[1] and (key, up) in listed[0]
    # a re-sent part replaces the older one, whichever gateway had it
    parts[1] = os.urandom(5 * MiB)
    etags[1] = wa.upload_part(Bucket=bkt, Key=key, UploadId=up, PartNumber=2, Body=parts[1])["ETag"]
    assert _parts(wb, bkt, key, up)[1] == (2, 5 * MiB, etags[1])
    done = _complete(wa, bkt, key, up, etags)
    whole = b"".join(parts)
    got = wa.get_object(Bucket=bkt, Key=key)
    assert got["Body"].read() == whole and got["ETag"] == done["ETag"]
    assert wb.get_object(Bucket=bkt, Key=key)["Body"].read() == whole
    assert _store_bytes(gw_dataset, key) == whole
    assert sorted(os.listdir(gws.uploads)) == [".tmp", ".trash"]
    assert os.listdir(gws.uploads / ".trash") == []


def test_abort_cleans_the_parts(wa: Any, wb: Any, gw_dataset: GatewayData, gws: Gateways) -> None:
    bkt, key = gw_dataset.bucket, "data/ckpt/aborted-shared.bin"
    up = wa.create_multipart_upload(Bucket=bkt, Key=key)["UploadId"]
    wa.upload_part(Bucket=bkt, Key=key, UploadId=up, PartNumber=1, Body=b"a" * 1000)
    wb.upload_part(Bucket=bkt, Key=key, UploadId=up, PartNumber=2, Body=b"b" * 1000)
    assert len(os.listdir(gws.uploads / up)) == 3  # upload.json and two parts
    wb.abort_multipart_upload(Bucket=bkt, Key=key, UploadId=up)
    assert not (gws.uploads / up).exists()
    assert os.listdir(gws.uploads / ".trash") == []
    for client in (wa, wb):
        with pytest.raises(ClientError) as e:
            client.list_parts(Bucket=bkt, Key=key, UploadId=up)
        assert code_of(e.value) == (404, "NoSuchUpload")
        with pytest.raises(ClientError) as e:
            client.upload_part(Bucket=bkt, Key=key, UploadId=up, PartNumber=3, Body=b"c")
        assert code_of(e.value) == (404, "NoSuchUpload")
        uploads = client.list_multipart_uploads(Bucket=bkt).get("Uploads", [])
        assert up not in [u["UploadId"] for u in uploads]
    with pytest.raises(ClientError) as e:
        wa.get_object(Bucket=bkt, Key=key)
    assert code_of(e.value) == (404, "NoSuchKey")


def test_list_uploads_pages_with_markers(wa: Any, wb: Any, gw_dataset: GatewayData) -> None:
    """boto3's paginator walks ListMultipartUploads with key-marker and
    upload-id-marker: every upload once, in key order, also two on one key split
    across pages; a bad max-uploads is a 400."""
    bkt = gw_dataset.bucket
    keys = ["data/pages/a.bin", "data/pages/b.bin", "data/pages/b.bin", "data/pages/c.bin"]
    ups = [(k, wa.create_multipart_upload(Bucket=bkt, Key=k)["UploadId"]) for k in keys]
    try:
        pages = list(
            wb.get_paginator("list_multipart_uploads").paginate(
                Bucket=bkt, Prefix="data/pages/", PaginationConfig={"PageSize": 1}
            )
        )
        seen = [(u["Key"], u["UploadId"]) for p in pages for u in p.get("Uploads", [])]
        assert len(pages) == 4 and sorted(seen) == sorted(ups), (len(pages), seen)
        assert [k for k, _ in seen] == sorted(keys)
        first = wb.list_multipart_uploads(Bucket=bkt, Prefix="data/pages/", MaxUploads=3)
        assert first["IsTruncated"] and len(first["Uploads"]) == 3
        rest = wb.list_multipart_uploads(
            Bucket=bkt,
            Prefix="data/pages/",
            KeyMarker=first["NextKeyMarker"],
            UploadIdMarker=first["NextUploadIdMarker"],
        )
        assert [(u["Key"], u["UploadId"]) for u in rest["Uploads"]] == [seen[3]]
        assert not rest["IsTruncated"]
        after_b = wb.list_multipart_uploads(Bucket=bkt, Prefix="data/pages/", KeyMarker=keys[1])
        assert [u["Key"] for u in after_b["Uploads"]] == [keys[3]]
        with pytest.raises(ClientError) as e:
            wb.list_multipart_uploads(Bucket=bkt, MaxUploads=-1)
        assert code_of(e.value)[0] == 400
    finally:
        for k, up in ups:
            wa.abort_multipart_upload(Bucket=bkt, Key=k, UploadId=up)


def test_another_identity_is_refused(
    a: Gateway, b: Gateway, wa: Any, gw_dataset: GatewayData, s3_client_for: Any
) -> None:
    import boto3
    from botocore.config import Config

    bkt, key = gw_dataset.bucket, "data/ckpt/mine.bin"
    up = wa.create_multipart_upload(Bucket=bkt, Key=key)["UploadId"]
    etag = wa.upload_part(Bucket=bkt, Key=key, UploadId=up, PartNumber=1, Body=b"mine")["ETag"]
    cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
    for gw in (a, b):
        rival = boto3.client(
            "s3", endpoint_url=gw.url, region_name="us-east-1", config=cfg,
            aws_access_key_id=RIVAL[0], aws_secret_access_key=RIVAL[1],
        )  # fmt: skip
        calls = [
            lambda c: c.list_parts(Bucket=bkt, Key=key, UploadId=up),
            lambda c: c.upload_part(Bucket=bkt, Key=key, UploadId=up, PartNumber=2, Body=b"x"),
            lambda c: _complete(c, bkt, key, up, [etag]),
            lambda c: c.abort_multipart_upload(Bucket=bkt, Key=key, UploadId=up),
        ]
        for call in calls:
            with pytest.raises(ClientError) as e:
                call(rival)
            assert code_of(e.value) == (403, "AccessDenied")
    reader = s3_client_for(a.url, "reader")
    with pytest.raises(ClientError) as e:
        reader.abort_multipart_upload(Bucket=bkt, Key=key, UploadId=up)
    assert code_of(e.value) == (403, "AccessDenied")
    # the id names one key; a made-up id names nothing
    for other_key, other_id in (("data/ckpt/other.bin", up), (key, "A" * 32), (key, "../../x")):
        with pytest.raises(ClientError) as e:
            wa.list_parts(Bucket=bkt, Key=other_key, UploadId=other_id)
        assert code_of(e.value) == (404, "NoSuchUpload")
    assert _parts(wa, bkt, key, up) == [(1, 4, etag)]  # untouched
    wa.abort_multipart_upload(Bucket=bkt, Key=key, UploadId=up)


def test_upload_part_copy_from_cached_object(wa: Any, gw_dataset: GatewayData) -> None:
    bkt, src, dst = gw_dataset.bucket, "data/ckpt/copy-src.bin", "data/ckpt/copy-dst.bin"
    body = os.urandom(11 * MiB)
    wa.put_object(Bucket=bkt, Key=src, Body=body)
    assert wa.get_object(Bucket=bkt, Key=src)["Body"].read() == body  # now cached
    # gone from the store behind the cache's back: the copy can only come from the cache
    s3_client(gw_dataset.moto.endpoint).delete_object(Bucket=bkt, Key=src.removeprefix("data/"))
    small_key = next(k for k, v in gw_dataset.files.items() if len(v) < MiB)
    up = wa.create_multipart_upload(Bucket=bkt, Key=dst)["UploadId"]
    copies = [
        (src, f"bytes=0-{5 * MiB - 1}"),
        (src, f"bytes={5 * MiB}-{len(body) - 1}"),
        (small_key, None),
    ]
    etags = []
    for n, (key, rng) in enumerate(copies, 1):
        kw = {"CopySourceRange": rng} if rng else {}
        r = wa.upload_part_copy(
            Bucket=bkt, Key=dst, UploadId=up, PartNumber=n,
            CopySource={"Bucket": bkt, "Key": key}, **kw,
        )  # fmt: skip
        etags.append(r["CopyPartResult"]["ETag"])
        assert r["CopyPartResult"]["LastModified"]
    sizes = [5 * MiB, len(body) - 5 * MiB, len(gw_dataset.files[small_key])]
    assert _parts(wa, bkt, dst, up) == [(i + 1, s, etags[i]) for i, s in enumerate(sizes)]
    src_etag = wa.head_object(Bucket=bkt, Key=src)["ETag"]
    refusals = [
        ((400, "InvalidArgument"), {"CopySourceRange": "bytes=9-3"}),
        ((400, "InvalidArgument"), {"CopySourceRange": "bytes=0-"}),
        ((400, "InvalidArgument"), {"CopySourceRange": "items=0-1"}),
        ((416, "InvalidRange"), {"CopySourceRange": f"bytes=0-{len(body)}"}),
        ((412, "PreconditionFailed"), {"CopySourceIfMatch": '"nope"'}),
        ((412, "PreconditionFailed"), {"CopySourceIfNoneMatch": src_etag}),
        ((404, "NoSuchKey"), {"CopySource": {"Bucket": bkt, "Key": "data/none.bin"}}),
    ]
    for want, kw in refusals:
        args = {"CopySource": {"Bucket": bkt, "Key": src}, **kw}
        with pytest.raises(ClientError) as e:
            wa.upload_part_copy(Bucket=bkt, Key=dst, UploadId=up, PartNumber=4, **args)
        assert code_of(e.value) == want, kw
    wa.upload_part_copy(
        Bucket=bkt, Key=dst, UploadId=up, PartNumber=4,
        CopySource={"Bucket": bkt, "Key": src}, CopySourceIfMatch=src_etag,
        CopySourceRange="bytes=10-19",
    )  # fmt: skip
    done = _complete(wa, bkt, dst, up, etags)  # part 4 is left out of the object
    whole = body + gw_dataset.files[small_key]
    got = wa.get_object(Bucket=bkt, Key=dst)
    assert got["Body"].read() == whole and got["ETag"] == done["ETag"]
    assert _store_bytes(gw_dataset, dst) == whole


def test_managed_copy_in_parts(wa: Any, gw_dataset: GatewayData) -> None:
    bkt, src, dst = gw_dataset.bucket, "data/big/large.bin", "data/ckpt/large-copy.bin"
    cfg = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    wa.copy({"Bucket": bkt, "Key": src}, bkt, dst, Config=cfg)  # 9 MiB: two UploadPartCopy
    want = gw_dataset.files[src]
    assert wa.get_object(Bucket=bkt, Key=dst)["Body"].read() == want
    assert _store_bytes(gw_dataset, dst) == want


def test_abandoned_uploads_expire(
    gws: Gateways, gw_dataset: GatewayData, s3_client_for: Any
) -> None:
    uploads = gws.d / "expiring"
    e = gws.start("e", "--uploads-dir", str(uploads), "--upload-max-age", "5")
    we = s3_client_for(e.url, "writer")
    bkt, key = gw_dataset.bucket, "data/ckpt/abandoned.bin"
    up = we.create_multipart_upload(Bucket=bkt, Key=key)["UploadId"]
    we.upload_part(Bucket=bkt, Key=key, UploadId=up, PartNumber=1, Body=b"left behind")
    assert up in [u["UploadId"] for u in we.list_multipart_uploads(Bucket=bkt)["Uploads"]]
    deadline = time.monotonic() + 60
    while (uploads / up).exists():  # the sweep has no event to wait on: poll for it
        assert time.monotonic() < deadline, "the abandoned upload was not removed"
        time.sleep(0.2)
    assert "Uploads" not in we.list_multipart_uploads(Bucket=bkt)
    with pytest.raises(ClientError) as exc:
        we.list_parts(Bucket=bkt, Key=key, UploadId=up)
    assert code_of(exc.value) == (404, "NoSuchUpload")
    assert os.listdir(uploads / ".trash") == []

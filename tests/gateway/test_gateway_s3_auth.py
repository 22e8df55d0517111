"""Authentication and hostile input at the S3 gateway: bad signatures, unknown keys,
skewed clocks, expired presigned URLs, scopes, anonymous and public access, path
traversal in keys, oversized and malformed requests."""

from __future__ import annotations

import datetime as dt
import http.client
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from unittest import mock
from urllib.parse import urlsplit

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials
from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from conftest import Gateway, GatewayData

pytestmark = pytest.mark.integration

SMALL = "data/000/f000003.bin"


def code_of(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


def refused(call: Any, **kw: Any) -> tuple[int, str]:
    with pytest.raises(ClientError) as e:
        call(**kw)
    return code_of(e.value)


def raw(
    url: str,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    key: tuple[str, str] | None = None,
    body: bytes = b"",
) -> tuple[int, bytes]:
    """One request with ``path`` sent exactly as given (signed with SigV4 by ``key``)."""
    u = urlsplit(url)
    h = dict(headers or {})
    if key is not None:
        req = AWSRequest(method=method, url=url + path, headers=dict(h), data=body)
        req.headers["X-Amz-Content-SHA256"] = "UNSIGNED-PAYLOAD"
        S3SigV4Auth(BotoCredentials(*key), "s3", "us-east-1").add_auth(req)
        h = {k: str(v) for k, v in req.headers.items()}
    conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_host="Host" in h, skip_accept_encoding=True)
        for k, v in h.items():
            conn.putheader(k, v)
        conn.endheaders(body or None)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def keys(gwkit: Any) -> Any:
    return gwkit.KEYS


def test_bad_signature_and_unknown_key(
    s3_gateway: Gateway, gw_dataset: GatewayData, s3_client_for: Any, keys: Any
) -> None:
    import boto3

    key, _ = keys["reader"]
    wrong = boto3.client(
        "s3",
        endpoint_url=s3_gateway.url,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key="not-the-secret",
    )
    status, code = refused(wrong.get_object, Bucket=gw_dataset.bucket, Key=SMALL)
    assert (status, code) == (403, "SignatureDoesNotMatch")
    unknown = boto3.client(
        "s3",
        endpoint_url=s3_gateway.url,
        region_name="us-east-1",
        aws_access_key_id="AKIDNOBODY",
        aws_secret_access_key="whatever",
    )
    assert refused(unknown.list_buckets) == (403, "InvalidAccessKeyId")
    # the body names neither the secret nor the signature
    status, body = raw(
        s3_gateway.url, "GET", f"/{gw_dataset.bucket}/{SMALL}", key=(key, "not-the-secret")
    )
    assert status == 403 and b"not-the-secret" not in body and b"<RequestId>" in body


def _shifted(delta: dt.timedelta) -> Any:
    return mock.patch(
        "botocore.auth.get_current_datetime",
        lambda: dt.datetime.now(dt.UTC).replace(tzinfo=None) + delta,
    )


def test_skewed_clock(s3_gateway: Gateway, gw_dataset: GatewayData, s3_client_for: Any) -> None:
    s3 = s3_client_for(s3_gateway.url, "reader")
    with _shifted(dt.timedelta(hours=-1)):
        got = refused(s3.get_object, Bucket=gw_dataset.bucket, Key=SMALL)
    assert got == (403, "RequestTimeTooSkewed")
    with _shifted(dt.timedelta(minutes=-5)):  # within the 15 minutes
        assert s3.get_object(Bucket=gw_dataset.bucket, Key=SMALL)["Body"].read()


def test_expired_presign(s3_gateway: Gateway, gw_dataset: GatewayData, s3_client_for: Any) -> None:
    s3 = s3_client_for(s3_gateway.url, "reader", signature_version="s3v4")
    params = {"Bucket": gw_dataset.bucket, "Key": SMALL}
    with _shifted(dt.timedelta(hours=-2)):
        url = s3.generate_presigned_url("get_object", Params=params, ExpiresIn=60)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url, timeout=10)
    assert e.value.code == 403 and b"expired" in e.value.read()
    v2 = s3_client_for(s3_gateway.url, "reader", signature_version="s3")
    url = v2.generate_presigned_url("get_object", Params=params, ExpiresIn=1)
    expires = int(url.split("Expires=")[1].split("&")[0])
    stale = url.replace(f"Expires={expires}", f"Expires={expires - 3600}")
    with pytest.raises(urllib.error.HTTPError) as e:  # expired, or the signature no longer fits
        urllib.request.urlopen(stale, timeout=10)
    assert e.value.code == 403


def test_scopes_and_anonymous(
    s3_gateway: Gateway, gw_dataset: GatewayData, s3_client_for: Any
) -> None:
    bkt = gw_dataset.bucket
    stranger = s3_client_for(s3_gateway.url, "stranger")
    assert refused(stranger.get_object, Bucket=bkt, Key=SMALL) == (403, "AccessDenied")
    assert refused(stranger.list_objects_v2, Bucket=bkt) == (403, "AccessDenied")
    assert refused(stranger.head_bucket, Bucket=bkt)[0] == 403
    assert bkt not in [b["Name"] for b in stranger.list_buckets()["Buckets"]]
    anon = s3_client_for(s3_gateway.url, None)
    assert refused(anon.get_object, Bucket=bkt, Key=SMALL) == (403, "AccessDenied")
    assert refused(anon.list_objects_v2, Bucket=bkt) == (403, "AccessDenied")
    assert refused(anon.list_buckets) == (403, "AccessDenied")
    assert refused(anon.put_object, Bucket=bkt, Key="data/x", Body=b"x") == (403, "AccessDenied")
    reader = s3_client_for(s3_gateway.url, "reader")
    got = refused(reader.put_object, Bucket=bkt, Key="data/x", Body=b"x")
    assert got == (403, "AccessDenied")  # a read role, on a writable dataset


@pytest.fixture(scope="module")
def public_gateway(
    gw_dataset: GatewayData, tmp_path_factory: pytest.TempPathFactory, gwkit: Any
) -> Iterator[Gateway]:
    d = tmp_path_factory.mktemp("s3pub")
    creds = gwkit.write_credentials(
        d / "c.toml", {"reader": [gw_dataset.dataset]}, [gw_dataset.dataset]
    )
    url, proc = gwkit.start_gateway(
        "s3",
        gw_dataset.cluster.master_url,
        ["--credentials", str(creds), "--domain", "s3.test"],
        d / "log",
    )
    try:
        yield gwkit.Gateway(url, proc, creds, d / "log")
    finally:
        gwkit.stop_gateway(proc)


def test_public_dataset_reads_without_signature(
    public_gateway: Gateway, gw_dataset: GatewayData, s3_client_for: Any
) -> None:
    anon = s3_client_for(public_gateway.url, None)
    bkt = gw_dataset.bucket
    assert anon.get_object(Bucket=bkt, Key=SMALL)["Body"].read() == gw_dataset.files[SMALL]
    assert anon.list_objects_v2(Bucket=bkt, Prefix="data/000/")["KeyCount"] > 0
    assert [b["Name"] for b in anon.list_buckets()["Buckets"]] == [bkt]
    assert refused(anon.put_object, Bucket=bkt, Key="data/x", Body=b"x") == (403, "AccessDenied")


def test_virtual_host_style(public_gateway: Gateway, gw_dataset: GatewayData) -> None:
    port = public_gateway.url.rsplit(":", 1)[1]
    host = {"Host": f"{gw_dataset.bucket}.s3.test:{port}"}
    status, body = raw(public_gateway.url, "GET", f"/{SMALL}", host)
    assert (status, body) == (200, gw_dataset.files[SMALL])
    status, body = raw(public_gateway.url, "GET", "/?list-type=2&prefix=data/000/&max-keys=2", host)
    assert status == 200 and body.count(b"<Key>") == 2
    status, body = raw(public_gateway.url, "GET", f"/{gw_dataset.bucket}/{SMALL}")  # path style
    assert (status, body) == (200, gw_dataset.files[SMALL])
    status, body = raw(public_gateway.url, "GET", f"/{gw_dataset.bucket}/?list-type=2&delimiter=/")
    assert status == 200 and b"<Prefix>data/</Prefix>" in body  # '/bucket/': a trailing slash


@pytest.mark.parametrize(
    "key, want",
    [
        ("data/../data/000/f000003.bin", (404, "NoSuchKey")),
        ("data/000/./f000003.bin", (404, "NoSuchKey")),
        ("../etc/passwd", (404, "NoSuchKey")),
        ("data//000/f000003.bin", (404, "NoSuchKey")),
        ("data/000/f\x00.bin", (400, "InvalidArgument")),
        ("data/" + "x" * 1100, (400, "KeyTooLongError")),
    ],
)
def test_hostile_keys(
    s3_gateway: Gateway, gw_dataset: GatewayData, s3_client_for: Any, key: str, want: Any
) -> None:
    s3 = s3_client_for(s3_gateway.url, "everyone")
    assert refused(s3.get_object, Bucket=gw_dataset.bucket, Key=key) == want


def test_encoded_traversal_in_raw_path(
    s3_gateway: Gateway, gw_dataset: GatewayData, keys: Any
) -> None:
    for path in (
        f"/{gw_dataset.bucket}/data/%2e%2e/data/000/f000003.bin",
        f"/{gw_dataset.bucket}/%2E%2E/%2e%2e/etc/passwd",
        f"/{gw_dataset.bucket}/data/000/f%00.bin",
    ):
        status, body = raw(s3_gateway.url, "GET", path, key=keys["everyone"])
        assert status in (400, 403, 404), (path, status)
        assert body.startswith(b"<?xml") and gw_dataset.files[SMALL] not in body


def test_oversized_and_malformed(s3_gateway: Gateway, gw_dataset: GatewayData, keys: Any) -> None:
    url, bkt = s3_gateway.url, gw_dataset.bucket
    status, _ = raw(url, "GET", f"/{bkt}/{SMALL}", {"X-Big": "a" * 20_000}, keys["reader"])
    assert status in (400, 431)
    many = {f"X-H{i}": "v" * 100 for i in range(700)}
    status, _ = raw(url, "GET", f"/{bkt}/{SMALL}", many)
    assert status in (400, 431)
    status, body = raw(
        url, "PUT", f"/{bkt}/data/huge.bin", {"Content-Length": str(6 << 30)}, keys["writer"]
    )
    assert status == 400 and b"EntityTooLarge" in body
    status, body = raw(url, "GET", f"/{bkt}?list-type=2&max-keys=abc", key=keys["reader"])
    assert status == 400 and b"InvalidArgument" in body
    status, body = raw(url, "GET", f"/{bkt}/{SMALL}", {"Authorization": "Basic Zm9vOmJhcg=="})
    assert status == 400 and b"<Code>" in body


def test_allow_anonymous_mode(
    gw_dataset: GatewayData, tmp_path: Any, gwkit: Any, s3_client_for: Any
) -> None:
    url, proc = gwkit.start_gateway(
        "s3", gw_dataset.cluster.master_url, ["--allow-anonymous"], tmp_path / "log"
    )
    try:
        anon = s3_client_for(url, None)
        bkt = gw_dataset.bucket
        assert anon.get_object(Bucket=bkt, Key=SMALL)["Body"].read() == gw_dataset.files[SMALL]
        assert bkt in [b["Name"] for b in anon.list_buckets()["Buckets"]]
        assert refused(anon.put_object, Bucket=bkt, Key="data/x", Body=b"x")[0] == 403
        signed = s3_client_for(url, "reader")  # no key is known in this mode
        assert refused(signed.get_object, Bucket=bkt, Key=SMALL) == (403, "InvalidAccessKeyId")
    finally:
        gwkit.stop_gateway(proc)

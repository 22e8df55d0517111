"""The S3 gateway's signature verifier against AWS's published vectors and against
requests signed by botocore itself (header SigV4, presigned SigV4, presigned SigV2,
header SigV2), with every single-character tampering refused."""

from __future__ import annotations

import calendar
import contextlib
import hashlib
import io
import json
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import boto3
import botocore.exceptions
import pytest
from botocore.auth import HmacV1Auth, HmacV1QueryAuth, S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest, AWSResponse
from botocore.config import Config as BotoConfig
from botocore.credentials import Credentials as BotoCredentials

from shoal.gateway.sigv4 import (
    EMPTY_SHA256,
    AuthError,
    HttpRequest,
    Verified,
    payload_check,
    verify,
)

# --- AWS's generic SigV4 test suite (aws-sig-v4-test-suite, service "service") --------

SUITE_SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
SUITE_NOW = calendar.timegm((2015, 8, 30, 12, 36, 0))
SUITE_HOST = ("Host", "example.amazonaws.com")
SUITE_DATE = ("X-Amz-Date", "20150830T123600Z")

# name, method, raw path, raw query, extra headers (as the suite's .req sends them),
# body, the suite's signature
SUITE = [
    ("get-vanilla", "GET", "/", "", [], b"", "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
    ("get-vanilla-query", "GET", "/", "", [], b"", "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
    ("get-vanilla-query-order-key-case", "GET", "/", "Param2=value2&Param1=value1", [], b"", "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"),
    ("get-vanilla-empty-query-key", "GET", "/", "Param1=value1", [], b"", "a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb"),
    ("get-vanilla-query-unreserved", "GET", "/", "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz=-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", [], b"", "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197"),
    ("get-vanilla-utf8-query", "GET", "/", "ሴ=bar", [], b"", "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04"),
    ("get-unreserved", "GET", "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", "", [], b"", "07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f"),
    ("get-utf8", "GET", "/ሴ", "", [], b"", "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85"),
    ("get-header-key-duplicate", "GET", "/", "", [("My-Header1", "value2"), ("My-Header1", "value2"), ("My-Header1", "value1")], b"", "c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea"),
    ("get-header-value-order", "GET", "/", "", [("My-Header1", "value4"), ("My-Header1", "value1"), ("My-Header1", "value3"), ("My-Header1", "value2")], b"", "08c7e5a9acfcfeb3ab6b2185e75ce8b1deb5e634ec47601a50643f830c755c01"),
    ("get-header-value-trim", "GET", "/", "", [("My-Header1", " value1 "), ("My-Header2", ' "a   b   c" ')], b"", "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736"),
    ("post-vanilla", "POST", "/", "", [], b"", "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"),
    ("post-header-key-case", "POST", "/", "", [], b"", "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"),
    ("post-header-key-sort", "POST", "/", "", [("My-Header1", "value1")], b"", "c5410059b04c1ee005303aed430f6e6645f61f4dc9e1461ec8f8916fdf18852c"),
    ("post-header-value-case", "POST", "/", "", [("My-Header1", "VALUE1")], b"", "cdbc9802e29d2942e5e10b5bccfdd67c5f22c7c4e8ae67b53629efa58b974b7d"),
    ("post-vanilla-query", "POST", "/", "Param1=value1", [], b"", "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11"),
    ("post-vanilla-empty-query-value", "POST", "/", "Param1=value1", [], b"", "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11"),
    ("post-x-www-form-urlencoded", "POST", "/", "", [("Content-Type", "application/x-www-form-urlencoded")], b"Param1=value1", "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a"),
    ("post-x-www-form-urlencoded-parameters", "POST", "/", "", [("Content-Type", "application/x-www-form-urlencoded; charset=utf8")], b"Param1=value1", "1a72ec8f64bd914b0e42e42607c7fbce7fb2c7465f63e3092b3b0d39fa77a6fe"),
    ("post-sts-header-before", "POST", "/", "", [("X-Amz-Security-Token", "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8YUuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA==")], b"", "85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead"),
]  # fmt: skip


def _suite_request(
    method: str, path: str, query: str, extra: list[tuple[str, str]], sig: str
) -> HttpRequest:
    headers = [SUITE_HOST, SUITE_DATE, *extra]
    signed = ";".join(sorted({h.lower() for h, _ in headers}))
    authz = (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        f"SignedHeaders={signed}, Signature={sig}"
    )
    return HttpRequest(method, path, query, [*headers, ("Authorization", authz)])


def _suite_secret(key: str) -> str | None:
    return SUITE_SECRET if key == "AKIDEXAMPLE" else None


@pytest.mark.parametrize(
    ("name", "method", "path", "query", "extra", "body", "sig"), SUITE, ids=[s[0] for s in SUITE]
)
def test_aws_sigv4_suite_vector_verifies(
    name: str,
    method: str,
    path: str,
    query: str,
    extra: list[tuple[str, str]],
    body: bytes,
    sig: str,
) -> None:
    req = _suite_request(method, path, query, extra, sig)
    got = verify(
        req,
        _suite_secret,
        SUITE_NOW,
        service="service",
        body_sha256=hashlib.sha256(body).hexdigest(),
    )
    assert got is not None
    assert got.access_key == "AKIDEXAMPLE"
    assert got.scheme == "v4-header"
    assert got.scope == "20150830/us-east-1/service/aws4_request"


@pytest.mark.parametrize(
    ("name", "method", "path", "query", "extra", "body", "sig"),
    SUITE[:8],
    ids=[s[0] for s in SUITE[:8]],
)
def test_aws_sigv4_suite_vector_with_other_signature_fails(
    name: str,
    method: str,
    path: str,
    query: str,
    extra: list[tuple[str, str]],
    body: bytes,
    sig: str,
) -> None:
    wrong = sig[:-1] + ("0" if sig[-1] != "0" else "1")
    req = _suite_request(method, path, query, extra, wrong)
    with pytest.raises(AuthError) as e:
        verify(req, _suite_secret, SUITE_NOW, service="service", body_sha256=EMPTY_SHA256)
    assert e.value.code == "SignatureDoesNotMatch"
    assert wrong not in e.value.message


def test_suite_vector_is_refused_for_s3_service_and_without_payload_header() -> None:
    _, method, path, query, extra, _, sig = SUITE[0]
    req = _suite_request(method, path, query, extra, sig)
    with pytest.raises(AuthError) as e:
        verify(req, _suite_secret, SUITE_NOW)  # service defaults to "s3"
    assert e.value.code in ("AuthorizationHeaderMalformed", "MissingSecurityHeader")
    assert e.value.http_status == 400


# --- the S3 examples of "Signature Calculations in AWS Signature Version 4" -----------

S3_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
S3_KEY = "AKIAIOSFODNN7EXAMPLE"
S3_NOW = calendar.timegm((2013, 5, 24, 0, 0, 0))
S3_HOST = ("Host", "examplebucket.s3.amazonaws.com")
S3_CRED = f"Credential={S3_KEY}/20130524/us-east-1/s3/aws4_request"


def _s3_secret(key: str) -> str | None:
    return S3_SECRET if key == S3_KEY else None


def _s3_header(
    method: str, path: str, query: str, headers: list[tuple[str, str]], sig: str
) -> HttpRequest:
    signed = ";".join(sorted(h.lower() for h, _ in headers))
    authz = f"AWS4-HMAC-SHA256 {S3_CRED},SignedHeaders={signed},Signature={sig}"
    return HttpRequest(method, path, query, [*headers, ("Authorization", authz)])


S3_EXAMPLES = [
    ("get-object-range", "GET", "/test.txt", "", [S3_HOST, ("Range", "bytes=0-9"), ("x-amz-content-sha256", EMPTY_SHA256), ("x-amz-date", "20130524T000000Z")], "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"),
    ("put-object", "PUT", "/test%24file.text", "", [("Date", "Fri, 24 May 2013 00:00:00 GMT"), S3_HOST, ("x-amz-content-sha256", "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072"), ("x-amz-date", "20130524T000000Z"), ("x-amz-storage-class", "REDUCED_REDUNDANCY")], "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"),
    ("get-bucket-lifecycle", "GET", "/", "lifecycle", [S3_HOST, ("x-amz-content-sha256", EMPTY_SHA256), ("x-amz-date", "20130524T000000Z")], "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"),
    ("list-objects", "GET", "/", "max-keys=2&prefix=J", [S3_HOST, ("x-amz-content-sha256", EMPTY_SHA256), ("x-amz-date", "20130524T000000Z")], "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "method", "path", "query", "headers", "sig"),
    S3_EXAMPLES,
    ids=[e[0] for e in S3_EXAMPLES],
)
def test_s3_documented_example_verifies(
    name: str, method: str, path: str, query: str, headers: list[tuple[str, str]], sig: str
) -> None:
    got = verify(_s3_header(method, path, query, headers, sig), _s3_secret, S3_NOW + 60)
    assert got is not None
    assert got.access_key == S3_KEY
    assert got.payload == dict((h.lower(), v) for h, v in headers)["x-amz-content-sha256"]


def test_s3_documented_put_checks_the_body_hash() -> None:
    _, method, path, query, headers, sig = S3_EXAMPLES[1]
    got = verify(_s3_header(method, path, query, headers, sig), _s3_secret, S3_NOW)
    assert got is not None
    payload_check(got, hashlib.sha256(b"Welcome to Amazon S3.").hexdigest())
    with pytest.raises(AuthError) as e:
        payload_check(got, hashlib.sha256(b"Welcome to Amazon S3!").hexdigest())
    assert e.value.code == "XAmzContentSHA256Mismatch"


def test_payload_check_passes_unsigned_and_streaming_declarations() -> None:
    for payload in ("UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"):
        payload_check(Verified("k", payload, "v4-header"), "00" * 32)


S3_PRESIGNED = (
    "X-Amz-Algorithm=AWS4-HMAC-SHA256"
    "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
    "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
    "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
)


def test_s3_documented_presigned_url_verifies_until_it_expires() -> None:
    req = HttpRequest("GET", "/test.txt", S3_PRESIGNED, [S3_HOST])
    got = verify(req, _s3_secret, S3_NOW + 86400)
    assert got is not None
    assert (got.scheme, got.payload) == ("v4-query", "UNSIGNED-PAYLOAD")
    with pytest.raises(AuthError) as e:
        verify(req, _s3_secret, S3_NOW + 86401)
    assert (e.value.code, e.value.message) == ("AccessDenied", "request has expired")


def test_s3_documented_chunked_upload_seed_signature_verifies() -> None:
    headers = [
        ("Host", "s3.amazonaws.com"),
        ("x-amz-date", "20130524T000000Z"),
        ("x-amz-storage-class", "REDUCED_REDUNDANCY"),
        ("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"),
        ("Content-Encoding", "aws-chunked"),
        ("x-amz-decoded-content-length", "66560"),
        ("Content-Length", "66824"),
    ]
    sig = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
    got = verify(
        _s3_header("PUT", "/examplebucket/chunkObject.txt", "", headers, sig), _s3_secret, S3_NOW
    )
    assert got is not None
    assert got.payload == "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    assert got.seed_signature == sig and got.signing_key is not None
    assert sig not in repr(got) and "signing_key" not in repr(got)


# --- requests signed by botocore ------------------------------------------------------

KEY = "AKIASHOALTEST0001"
SECRET = "sEcReT/with+odd=chars"
ENDPOINT = "http://127.0.0.1:9000"
CREDS = BotoCredentials(KEY, SECRET)

KEYS = [
    "plain.txt",
    "with space.txt",
    "ünïcödé/файл-日本.bin",
    "a+b=c&d.txt",
    "dir//double/slash",
    "trailing/",
    "semi;colon,comma!star*(paren)'quote@at:colon$",
    "percent%41literal",
    "tilde~under_score-dash.dot",
]
QUERIES = [
    "",
    "list-type=2&prefix=a%20b%2F&delimiter=%2F",
    "a=1&a=2&a=1&b=&c",
    "prefix=" + quote("ü+ /=", safe="-_.~") + "&encoding-type=url",
    "uploads",
    "partNumber=3&uploadId=abc%2Fdef",
]


def _secret(key: str) -> str | None:
    return SECRET if key == KEY else None


def _url(key: str, query: str = "") -> str:
    # what botocore's serializer sends: the key percent-encoded except '/' and '~'
    return f"{ENDPOINT}/bucket/{quote(key, safe='/~')}" + (f"?{query}" if query else "")


def _as_received(aws: AWSRequest, *, presigned: bool = False) -> HttpRequest:
    prepared = aws.prepare()
    split = urlsplit(prepared.url)
    # a presigned URL is used by something else (curl, a browser): no signer headers
    headers = [] if presigned else [(k, str(v)) for k, v in prepared.headers.items()]
    return HttpRequest(prepared.method, split.path, split.query, [("Host", split.netloc), *headers])


def sign_v4(
    method: str, url: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> HttpRequest:
    aws = AWSRequest(method=method, url=url, data=body, headers=headers or {})
    S3SigV4Auth(CREDS, "s3", "us-east-1").add_auth(aws)
    return _as_received(aws)


def presign_v4(url: str, expires: int = 3600) -> HttpRequest:
    aws = AWSRequest(method="GET", url=url)
    S3SigV4QueryAuth(CREDS, "s3", "us-east-1", expires=expires).add_auth(aws)
    return _as_received(aws, presigned=True)


def presign_v2(url: str, expires: int = 3600) -> HttpRequest:
    aws = AWSRequest(method="GET", url=url)
    HmacV1QueryAuth(CREDS, expires=expires).add_auth(aws)
    return _as_received(aws, presigned=True)


def sign_v2(method: str, url: str, headers: dict[str, str] | None = None) -> HttpRequest:
    aws = AWSRequest(method=method, url=url, headers=headers or {})
    HmacV1Auth(CREDS).add_auth(aws)
    return _as_received(aws)


SIGNERS: dict[str, Callable[[str], HttpRequest]] = {
    "v4-header": lambda url: sign_v4("GET", url, {"Range": "bytes=0-9"}),
    "v4-query": presign_v4,
    "v2-query": presign_v2,
    "v2-header": lambda url: sign_v2("GET", url, {"x-amz-meta-a": "b"}),
}
CASES = [(s, k, q) for s in SIGNERS for k in KEYS for q in QUERIES]


@pytest.mark.parametrize(("scheme", "key", "query"), CASES)
def test_botocore_signed_request_verifies(scheme: str, key: str, query: str) -> None:
    got = verify(SIGNERS[scheme](_url(key, query)), _secret)
    assert got is not None
    assert (got.access_key, got.scheme) == (KEY, scheme)


def test_botocore_signed_put_declares_the_body_hash() -> None:
    body = b"checkpoint bytes"
    got = verify(sign_v4("PUT", _url("ckpt/step 1.pt"), body=body), _secret)
    assert got is not None
    assert got.payload == hashlib.sha256(body).hexdigest()
    payload_check(got, hashlib.sha256(body).hexdigest())
    with pytest.raises(AuthError):
        payload_check(got, hashlib.sha256(body + b"x").hexdigest())


def test_anonymous_request_is_none() -> None:
    assert verify(HttpRequest("GET", "/bucket/k", "prefix=a", [("Host", "h")]), _secret) is None


def _substitutions(s: str) -> list[str]:
    return [s[:i] + ("x" if c != "x" else "y") + s[i + 1 :] for i, c in enumerate(s)]


def _tampered(
    req: HttpRequest, signed: set[str], query_from: int = 0
) -> list[tuple[str, HttpRequest]]:
    """Every request that differs from ``req`` by one character of the path, the query
    (from ``query_from`` on), a signed header value or the Authorization header."""
    out = [
        (f"path[{i}]", HttpRequest(req.method, p, req.raw_query, req.headers))
        for i, p in enumerate(_substitutions(req.raw_path))
    ]
    queries = _substitutions(req.raw_query)[query_from:]
    out += [
        (f"query[{i}]", HttpRequest(req.method, req.raw_path, q, req.headers))
        for i, q in enumerate(queries, query_from)
    ]
    for n, (name, value) in enumerate(req.headers):
        if name.lower() in signed or name.lower() == "authorization":
            for i, v in enumerate(_substitutions(value)):
                headers = list(req.headers)
                headers[n] = (name, v)
                out.append(
                    (f"{name}[{i}]", HttpRequest(req.method, req.raw_path, req.raw_query, headers))
                )
    return out


@pytest.mark.parametrize("scheme", list(SIGNERS))
def test_every_single_character_tampering_is_refused(scheme: str) -> None:
    req = SIGNERS[scheme](_url("dir/a b+c.txt", "versionId=7&prefix=x%2F&a=1&a=2"))
    assert verify(req, _secret) is not None
    signed = {"range", "x-amz-date", "x-amz-content-sha256", "x-amz-meta-a", "date"}
    if scheme.startswith("v4"):
        cases = _tampered(req, signed | {"host"})
    else:
        # SigV2 signs neither Host nor query parameters other than sub-resources
        # (versionId, acl, ...): tamper the path, the headers, versionId and its own
        signed_only = HttpRequest(
            req.method, req.raw_path, req.raw_query.replace("&prefix=x%2F&a=1&a=2", ""), req.headers
        )
        assert verify(signed_only, _secret) is not None
        cases = _tampered(signed_only, signed)
    assert len(cases) > 100
    accepted = []
    for where, bad in cases:
        try:
            verify(bad, _secret)
        except AuthError as e:
            assert e.http_status in (400, 403)
            assert SECRET not in e.message
        else:
            accepted.append(where)
    assert accepted == []


def test_tampered_payload_hash_is_a_signature_mismatch() -> None:
    req = sign_v4("PUT", _url("k"), body=b"abc")
    headers = [
        (n, v[:-1] + ("0" if v[-1] != "0" else "1"))
        if n.lower() == "x-amz-content-sha256"
        else (n, v)
        for n, v in req.headers
    ]
    with pytest.raises(AuthError) as e:
        verify(HttpRequest(req.method, req.raw_path, req.raw_query, headers), _secret)
    assert e.value.code == "SignatureDoesNotMatch"


def _expect(code: str, status: int, req: HttpRequest, now: float | None = None) -> AuthError:
    with pytest.raises(AuthError) as e:
        verify(req, _secret, now)
    assert (e.value.code, e.value.http_status) == (code, status)
    return e.value


def test_expired_presigns_are_refused() -> None:
    now = time.time()
    _expect("AccessDenied", 403, presign_v4(_url("k"), expires=60), now + 61)
    _expect("AccessDenied", 403, presign_v2(_url("k"), expires=60), now + 61)
    assert verify(presign_v4(_url("k"), expires=60), _secret, now + 50) is not None


def test_presign_longer_than_seven_days_is_refused() -> None:
    _expect("AuthorizationQueryParametersError", 400, presign_v4(_url("k"), expires=604801))
    assert verify(presign_v4(_url("k"), expires=604800), _secret) is not None
    _expect("AuthorizationQueryParametersError", 400, presign_v2(_url("k"), expires=30 * 86400))


def test_presign_from_the_future_is_refused() -> None:
    _expect("AccessDenied", 403, presign_v4(_url("k")), time.time() - 16 * 60)


@pytest.mark.parametrize("minutes", [16, -16])
def test_skewed_clock_is_refused(minutes: int) -> None:
    now = time.time() + minutes * 60
    _expect("RequestTimeTooSkewed", 403, sign_v4("GET", _url("k")), now)
    _expect("RequestTimeTooSkewed", 403, sign_v2("GET", _url("k")), now)
    assert verify(sign_v4("GET", _url("k")), _secret, time.time() + 14 * 60) is not None


def test_unknown_key_and_wrong_secret() -> None:
    req = sign_v4("GET", _url("k"))
    with pytest.raises(AuthError) as e:
        verify(req, lambda key: None)
    assert e.value.code == "InvalidAccessKeyId"
    for signed in (req, presign_v4(_url("k")), presign_v2(_url("k")), sign_v2("GET", _url("k"))):
        with pytest.raises(AuthError) as e:
            verify(signed, lambda key: "not the secret")
        assert e.value.code == "SignatureDoesNotMatch"


def test_missing_signed_header_is_refused() -> None:
    req = sign_v4("GET", _url("k"), {"Range": "bytes=0-9"})
    without = [(n, v) for n, v in req.headers if n.lower() != "range"]
    err = _expect(
        "AccessDenied", 403, HttpRequest(req.method, req.raw_path, req.raw_query, without)
    )
    assert "range" in err.message


def test_unsigned_amz_header_is_refused() -> None:
    req = sign_v4("GET", _url("k"))
    extra = [*req.headers, ("x-amz-copy-source", "/other/secret")]
    _expect("AccessDenied", 403, HttpRequest(req.method, req.raw_path, req.raw_query, extra))


def test_host_must_be_signed_and_match() -> None:
    req = sign_v4("GET", _url("k"))
    moved = [("Host", "evil:9000") if n == "Host" else (n, v) for n, v in req.headers]
    _expect(
        "SignatureDoesNotMatch", 403, HttpRequest(req.method, req.raw_path, req.raw_query, moved)
    )
    authz = dict(req.headers)["Authorization"].replace("SignedHeaders=host;", "SignedHeaders=")
    headers = [(n, authz if n == "Authorization" else v) for n, v in req.headers]
    _expect(
        "AuthorizationHeaderMalformed",
        400,
        HttpRequest(req.method, req.raw_path, req.raw_query, headers),
    )


def test_two_auth_mechanisms_are_refused() -> None:
    header = sign_v4("GET", _url("k"))
    query = presign_v4(_url("k"))
    both = HttpRequest("GET", query.raw_path, query.raw_query, header.headers)
    _expect("InvalidRequest", 400, both)


def test_unsupported_scheme_and_malformed_headers() -> None:
    for value in (
        "Bearer abc",
        "AWS4-ECDSA-P256-SHA256 Credential=x",
        "AWS4-HMAC-SHA256 garbage",
        "AWS nocolon",
    ):
        with pytest.raises(AuthError) as e:
            verify(
                HttpRequest("GET", "/b/k", "", [("Host", "h"), ("Authorization", value)]), _secret
            )
        assert e.value.http_status == 400


def test_v4_header_needs_payload_hash_for_s3() -> None:
    req = sign_v4("GET", _url("k"))
    headers = [(n, v) for n, v in req.headers if n.lower() != "x-amz-content-sha256"]
    _expect(
        "MissingSecurityHeader", 400, HttpRequest(req.method, req.raw_path, req.raw_query, headers)
    )


def test_error_messages_never_carry_the_signature() -> None:
    req = sign_v4("GET", _url("k"))
    sig = dict(req.headers)["Authorization"].rsplit("Signature=", 1)[1]
    with pytest.raises(AuthError) as e:
        verify(req, lambda key: "wrong")
    assert sig not in str(e.value) and sig not in repr(e.value)


def test_sigv2_can_be_disabled() -> None:
    for req in (presign_v2(_url("k")), sign_v2("GET", _url("k"))):
        with pytest.raises(AuthError) as e:
            verify(req, _secret, allow_v2=False)
        assert (e.value.code, e.value.http_status) == ("InvalidRequest", 400)
        assert "s3v4" in e.value.message
    assert verify(presign_v4(_url("k")), _secret, allow_v2=False) is not None


# --- requests captured from a real boto3 client ---------------------------------------


class _NoBody:
    def stream(self, **kwargs: object) -> Iterator[bytes]:
        yield b""


def _boto3_requests(
    endpoint: str, signature_version: str | None = None
) -> list[tuple[HttpRequest, bytes]]:
    """Run a set of S3 calls through boto3 against ``endpoint``; capture each request as
    it would reach the gateway instead of sending it."""
    captured: list[tuple[HttpRequest, bytes]] = []

    def capture(request: Any, **kwargs: object) -> AWSResponse:
        body = request.body
        if hasattr(body, "read"):
            body = body.read()
        split = urlsplit(request.url)
        headers = [
            (k, v.decode("latin-1") if isinstance(v, bytes) else v)
            for k, v in request.headers.items()
        ]
        headers.insert(0, ("Host", split.netloc))
        captured.append(
            (HttpRequest(request.method, split.path, split.query, headers), body or b"")
        )
        return AWSResponse(request.url, 200, {}, _NoBody())

    session = boto3.session.Session(
        aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name="us-east-1"
    )
    config = BotoConfig(
        signature_version=signature_version,
        s3={"addressing_style": "path"},
        retries={"max_attempts": 1},
    )
    s3 = session.client("s3", endpoint_url=endpoint, config=config)
    s3.meta.events.register("before-send.s3", capture)
    calls: list[tuple[str, dict[str, Any]]] = [
        ("list_objects_v2", {"Bucket": "ds", "Prefix": "train/ünï cödé+/", "Delimiter": "/"}),
        ("list_objects", {"Bucket": "ds", "Prefix": "a=b&c", "MaxKeys": 10}),
        ("get_object", {"Bucket": "ds", "Key": "dir//a b+c=d.bin", "Range": "bytes=0-9"}),
        ("head_object", {"Bucket": "ds", "Key": "trailing/"}),
        ("put_object", {"Bucket": "ds", "Key": "ckpt/step 1.pt", "Body": b"w" * 70000}),
        ("put_object", {"Bucket": "ds", "Key": "ckpt/stream", "Body": io.BytesIO(b"s" * 5000)}),
        ("create_multipart_upload", {"Bucket": "ds", "Key": "big file"}),
        (
            "upload_part",
            {
                "Bucket": "ds",
                "Key": "big file",
                "UploadId": "u/1+2",
                "PartNumber": 1,
                "Body": b"p" * 1000,
            },
        ),
        ("delete_objects", {"Bucket": "ds", "Delete": {"Objects": [{"Key": "x"}, {"Key": "y z"}]}}),
        (
            "copy_object",
            {"Bucket": "ds", "Key": "copy", "CopySource": {"Bucket": "ds", "Key": "src key"}},
        ),
        ("list_buckets", {}),
        ("head_bucket", {"Bucket": "ds"}),
    ]
    for name, params in calls:
        with contextlib.suppress(
            botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError
        ):
            getattr(s3, name)(**params)
    for key in ("a b/ü.txt", "x+y=z"):
        url = urlsplit(s3.generate_presigned_url("get_object", Params={"Bucket": "ds", "Key": key}))
        captured.append((HttpRequest("GET", url.path, url.query, [("Host", url.netloc)]), b""))
    return captured


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9000", "https://gw.example:8443"])
@pytest.mark.parametrize("signature_version", [None, "s3v4"])
def test_boto3_client_requests_verify(endpoint: str, signature_version: str | None) -> None:
    captured = _boto3_requests(endpoint, signature_version)
    assert len(captured) == 14
    schemes = []
    for req, body in captured:
        got = verify(req, _secret)
        assert got is not None, req
        assert got.access_key == KEY
        schemes.append(got.scheme)
        if got.payload not in ("UNSIGNED-PAYLOAD",) and not got.payload.startswith("STREAMING-"):
            payload_check(got, hashlib.sha256(body).hexdigest())
    # boto3 presigns with SigV2 by default for us-east-1, SigV4 when asked
    assert schemes[-2:] == (["v4-query"] * 2 if signature_version else ["v2-query"] * 2)
    assert set(schemes[:-2]) == {"v4-header"}


def test_boto3_https_put_is_aws_chunked_and_decodes() -> None:
    from shoal.gateway.chunked import AwsChunkedDecoder

    captured = _boto3_requests("https://gw.example:8443")
    puts = [(r, b) for r, b in captured if r.method == "PUT" and r.raw_path.startswith("/ds/ckpt/")]
    assert len(puts) == 2
    for req, body in puts:
        got = verify(req, _secret)
        assert got is not None and got.payload == "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
        headers = {k.lower(): v for k, v in req.headers}
        dec = AwsChunkedDecoder(
            got,
            decoded_length=int(headers["x-amz-decoded-content-length"]),
            checksum=headers["x-amz-trailer"],
        )
        data = b"".join(dec.feed(body[i : i + 777]) for i in range(0, len(body), 777))
        trailers = dec.finish()
        assert data in (b"w" * 70000, b"s" * 5000)
        assert set(trailers) == {"x-amz-checksum-crc32"}


def test_mangled_requests_fail_only_with_auth_errors() -> None:
    """Random edits (control characters, lone surrogates, '%' and separators) anywhere
    in a signed request give an AuthError, never another exception (a 500)."""
    rnd = random.Random(1)
    alphabet = "aZ09%&=;:,/ +\t\r\n\x00\udcff\u1234é*?#\\\"'"
    for signer in SIGNERS.values():
        base = signer(_url("a b/c", "x=1&y=%2F"))
        for _ in range(400):
            parts = [base.raw_path, base.raw_query, *(v for _, v in base.headers)]
            i = rnd.randrange(len(parts))
            pos = rnd.randint(0, len(parts[i]))
            parts[i] = parts[i][:pos] + "".join(rnd.choices(alphabet, k=3)) + parts[i][pos + 1 :]
            headers = [(n, parts[2 + j]) for j, (n, _) in enumerate(base.headers)]
            with contextlib.suppress(AuthError):
                verify(HttpRequest(base.method, parts[0], parts[1], headers), _secret)


def test_sigv2_virtual_hosted_request_signs_the_bucket() -> None:
    aws = AWSRequest(method="GET", url="http://ds.gw.example:9000/dir/a%20b", headers={})
    aws.auth_path = "/ds/dir/a%20b"  # what botocore signs for a virtual-hosted request
    HmacV1Auth(CREDS).add_auth(aws)
    req = _as_received(aws)
    got = verify(req, _secret, virtual_bucket="ds")
    assert got is not None and got.scheme == "v2-header"
    _expect("SignatureDoesNotMatch", 403, req)  # without the bucket: another resource
    with pytest.raises(AuthError):
        verify(req, _secret, virtual_bucket="other")


# --- requests captured from other real clients (curl, aws CLI, rclone, s3fs, CRT) -----

CAPTURES = json.loads((Path(__file__).parent / "gateway_sigv4_captures.json").read_text("utf-8"))


def _capture(c: dict[str, Any]) -> HttpRequest:
    return HttpRequest(c["method"], c["path"], c["query"], [(k, v) for k, v in c["headers"]])


def _capture_secret(key: str) -> str | None:
    return CAPTURES["secret"] if key == CAPTURES["access_key"] else None


@pytest.mark.parametrize(
    "c", CAPTURES["requests"], ids=lambda c: f"{c['client']} {c['method']} {c['path']}"
)
def test_captured_client_request_verifies(c: dict[str, Any]) -> None:
    got = verify(_capture(c), _capture_secret, c["now"])
    assert got is not None and got.access_key == CAPTURES["access_key"]
    payload_check(got, c["body_sha256"])
    with pytest.raises(AuthError):
        verify(_capture(c), lambda key: CAPTURES["secret"] + "x", c["now"])
    tampered = HttpRequest(c["method"], c["path"] + "x", c["query"], _capture(c).headers)
    with pytest.raises(AuthError):
        verify(tampered, _capture_secret, c["now"])


def test_captures_cover_five_clients() -> None:
    clients = {c["client"] for c in CAPTURES["requests"]}
    assert {
        "curl",
        "aws-cli",
        "rclone",
        "s3fs (aiobotocore)",
        "s3torchconnector",
        "aws-cli presign",
    } <= clients

"""The aws-chunked body decoder: AWS's documented signed uploads, botocore's unsigned
trailer bodies, any fragmentation, and every way a body can be wrong."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import os
import random
import zlib

import pytest
from botocore.httpchecksum import AwsChunkedWrapper, Crc32Checksum, Sha1Checksum, Sha256Checksum

from shoal.gateway.chunked import AwsChunkedDecoder
from shoal.gateway.sigv4 import AuthError, Verified, signing_key

# AWS S3 docs, "Signature Calculations for the Authorization Header: Transferring
# Payload in Multiple Chunks": 66560 bytes of 'a' in a 64 KiB and a 1 KiB chunk
KEY = signing_key("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "20130524", "us-east-1", "s3")
SIGNED = Verified(
    access_key="AKIAIOSFODNN7EXAMPLE",
    payload="STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
    scheme="v4-header",
    seed_signature="4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9",
    signing_key=KEY,
    amz_date="20130524T000000Z",
    scope="20130524/us-east-1/s3/aws4_request",
)
CHUNK_SIGS = [
    "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
    "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
    "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
]
BODY = (
    f"10000;chunk-signature={CHUNK_SIGS[0]}\r\n".encode()
    + b"a" * 65536
    + f"\r\n400;chunk-signature={CHUNK_SIGS[1]}\r\n".encode()
    + b"a" * 1024
    + f"\r\n0;chunk-signature={CHUNK_SIGS[2]}\r\n\r\n".encode()
)
PAYLOAD = b"a" * 66560

# the same documentation's trailer variant (STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER)
SIGNED_TRAILER = dataclasses.replace(
    SIGNED,
    payload="STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
    seed_signature="106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e",
)
TRAILER_BODY = (
    b"10000;chunk-signature=b474d8862b1487a5145d686f57f013e54db672cee1c953b3010fb58501ef5aa2\r\n"
    + b"a" * 65536
    + b"\r\n400;chunk-signature=1c1344b170168f8e65b41376b44b20fe354e373826ccbbe2c1d40a8cae51e5c7\r\n"
    + b"a" * 1024
    + b"\r\n0;chunk-signature=2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992\r\n\r\n"
    + b"x-amz-checksum-crc32c:sOO8/Q==\r\n"
    + b"x-amz-trailer-signature:d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435\r\n\r\n"
)
UNSIGNED_TRAILER = Verified("AK", "STREAMING-UNSIGNED-PAYLOAD-TRAILER", "v4-header")


def _decode(dec: AwsChunkedDecoder, body: bytes, step: int) -> tuple[bytes, dict[str, str]]:
    out = b"".join(dec.feed(body[i : i + step]) for i in range(0, len(body), step))
    return out, dec.finish()


@pytest.mark.parametrize("step", [1, 7, 4096, 65536 + 89, 10**6])
def test_aws_documented_signed_chunks_decode_in_any_fragments(step: int) -> None:
    assert len(BODY) == 66824  # the documented Content-Length
    out, trailers = _decode(AwsChunkedDecoder(SIGNED, decoded_length=66560), BODY, step)
    assert out == PAYLOAD
    assert trailers == {}


@pytest.mark.parametrize("step", [1, 13, 10**6])
def test_aws_documented_signed_trailer_decodes(step: int) -> None:
    out, trailers = _decode(
        AwsChunkedDecoder(SIGNED_TRAILER, decoded_length=66560), TRAILER_BODY, step
    )
    assert out == PAYLOAD
    assert trailers == {"x-amz-checksum-crc32c": "sOO8/Q=="}


def test_signed_trailer_also_without_the_blank_line_before_it() -> None:
    body = TRAILER_BODY.replace(b"\r\n\r\nx-amz-checksum", b"\r\nx-amz-checksum")
    out, trailers = _decode(AwsChunkedDecoder(SIGNED_TRAILER), body, 1000)
    assert out == PAYLOAD and trailers == {"x-amz-checksum-crc32c": "sOO8/Q=="}


def test_tampered_trailer_or_missing_trailer_signature_is_refused() -> None:
    for body in (
        TRAILER_BODY.replace(b"sOO8/Q==", b"sOO8/Q=A"),
        TRAILER_BODY.replace(b"d81f82fc", b"d81f82fd"),
        TRAILER_BODY.split(b"x-amz-trailer-signature")[0] + b"\r\n",
    ):
        dec = AwsChunkedDecoder(SIGNED_TRAILER)
        with pytest.raises(AuthError) as e:
            dec.feed(body)
            dec.finish()
        assert e.value.code == "SignatureDoesNotMatch"


def test_signed_chunk_bytes_are_released_only_after_their_signature() -> None:
    dec = AwsChunkedDecoder(SIGNED)
    first_chunk_end = BODY.index(b"\r\n400;")
    assert dec.feed(BODY[: first_chunk_end - 1]) == b""  # last byte of chunk 1 missing
    assert dec.feed(BODY[first_chunk_end - 1 : first_chunk_end]) == b""  # its CRLF missing
    assert dec.feed(BODY[first_chunk_end : first_chunk_end + 2]) == b"a" * 65536


@pytest.mark.parametrize("which", [0, 1, 2])
def test_bad_chunk_signature_is_refused(which: int) -> None:
    sig = CHUNK_SIGS[which]
    body = BODY.replace(sig.encode(), (sig[:-1] + ("0" if sig[-1] != "0" else "1")).encode())
    dec = AwsChunkedDecoder(SIGNED)
    released = b""
    with pytest.raises(AuthError) as e:
        for i in range(0, len(body), 1000):
            released += dec.feed(body[i : i + 1000])
        dec.finish()
    assert (e.value.code, e.value.http_status) == ("SignatureDoesNotMatch", 403)
    # nothing of the chunk with the bad signature came out (what came before may have)
    assert len(released) <= [0, 65536, 66560][which]
    assert released == b"a" * len(released)


def test_tampered_chunk_data_and_reordered_chunks_are_refused() -> None:
    flipped = bytearray(BODY)
    flipped[1000] = ord("b")
    first = BODY[: BODY.index(b"400;")]
    second = BODY[BODY.index(b"400;") : BODY.index(b"0;chunk")]
    for body in (bytes(flipped), second + first + BODY[BODY.index(b"0;chunk") :]):
        with pytest.raises(AuthError) as e:
            dec = AwsChunkedDecoder(SIGNED)
            dec.feed(body)
            dec.finish()
        assert e.value.code == "SignatureDoesNotMatch"


CUTS = [*range(0, 120), 65536 + 80, 65536 + 89, 65536 + 90, *range(len(BODY) - 90, len(BODY))]


@pytest.mark.parametrize("body", [BODY, TRAILER_BODY], ids=["signed", "signed-trailer"])
def test_every_truncation_is_refused(body: bytes) -> None:
    verified = SIGNED if body is BODY else SIGNED_TRAILER
    cuts = [c for c in CUTS if c < len(body)] + list(range(len(body) - 130, len(body)))
    for cut in cuts:
        dec = AwsChunkedDecoder(verified)
        with pytest.raises(AuthError) as e:
            dec.feed(body[:cut])
            dec.finish()
        assert e.value.http_status in (400, 403), cut


def test_decoded_length_mismatch_is_refused() -> None:
    for declared in (66559, 66561):
        dec = AwsChunkedDecoder(SIGNED, decoded_length=declared)
        with pytest.raises(AuthError):
            dec.feed(BODY)
            dec.finish()


def test_oversize_chunk_is_refused_before_its_data() -> None:
    dec = AwsChunkedDecoder(UNSIGNED_TRAILER)
    with pytest.raises(AuthError) as e:
        dec.feed(b"1000001\r\n")  # 16 MiB + 1
    assert e.value.code == "InvalidRequest" and "larger than" in e.value.message
    with pytest.raises(AuthError):
        AwsChunkedDecoder(SIGNED, max_chunk=1024).feed(BODY[:200])


def test_endless_header_line_is_refused() -> None:
    dec = AwsChunkedDecoder(UNSIGNED_TRAILER)
    with pytest.raises(AuthError) as e:
        for _ in range(10):
            dec.feed(b"f" * 1000)
    assert "too long" in e.value.message


def test_oversize_trailers_are_refused() -> None:
    dec = AwsChunkedDecoder(UNSIGNED_TRAILER)
    dec.feed(b"3\r\nabc\r\n0\r\n")
    with pytest.raises(AuthError) as e:
        for i in range(1000):
            dec.feed(f"x-amz-meta-{i}:{'v' * 100}\r\n".encode())
    assert "too large" in e.value.message


@pytest.mark.parametrize(
    ("verified", "body"),
    [
        (UNSIGNED_TRAILER, b"zz\r\nab\r\n0\r\n\r\n"),  # not hex
        (UNSIGNED_TRAILER, b"2\r\nabc\r\n0\r\n\r\n"),  # longer than declared
        (UNSIGNED_TRAILER, b"3;chunk-signature=" + b"0" * 64 + b"\r\nabc\r\n0\r\n\r\n"),
        (SIGNED, b"3\r\nabc\r\n"),  # signed body without chunk signatures
        (SIGNED, BODY + b"x"),  # data after the end
        (UNSIGNED_TRAILER, b"0\r\nno colon here\r\n\r\n"),
        (
            UNSIGNED_TRAILER,
            b"0\r\nx-amz-checksum-crc32:AAAAAA==\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n",
        ),
        (SIGNED, BODY[:-2] + b"x-amz-checksum-crc32:AAAAAA==\r\n\r\n"),  # trailer, not declared
    ],
)
def test_malformed_bodies_are_refused(verified: Verified, body: bytes) -> None:
    dec = AwsChunkedDecoder(verified)
    with pytest.raises(AuthError) as e:
        dec.feed(body)
        dec.finish()
    assert e.value.http_status in (400, 403)


def test_signed_payload_needs_a_sigv4_request() -> None:
    with pytest.raises(AuthError):
        AwsChunkedDecoder(Verified("AK", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD", "v2-header"))


# --- botocore's own aws-chunked bodies (STREAMING-UNSIGNED-PAYLOAD-TRAILER) -----------

CHECKSUMS = [("crc32", Crc32Checksum), ("sha1", Sha1Checksum), ("sha256", Sha256Checksum)]


def _botocore_body(data: bytes, name: str, cls: type, chunk_size: int) -> bytes:
    wrapper = AwsChunkedWrapper(
        io.BytesIO(data),
        checksum_cls=cls,
        checksum_name=f"x-amz-checksum-{name}",
        chunk_size=chunk_size,
    )
    return wrapper.read()


@pytest.mark.parametrize(("name", "cls"), CHECKSUMS)
@pytest.mark.parametrize("step", [1, 999, 10**7])
def test_botocore_unsigned_trailer_body_decodes_and_checksum_checks(
    name: str, cls: type, step: int
) -> None:
    data = os.urandom(3000 if step == 1 else 300_000)
    body = _botocore_body(data, name, cls, 1024 if step == 1 else 65536)
    dec = AwsChunkedDecoder(UNSIGNED_TRAILER, decoded_length=len(data), checksum=name)
    out, trailers = _decode(dec, body, step)
    assert out == data
    assert list(trailers) == [f"x-amz-checksum-{name}"]


@pytest.mark.parametrize(("name", "cls"), CHECKSUMS)
def test_botocore_body_with_corrupted_data_fails_its_checksum(name: str, cls: type) -> None:
    data = os.urandom(100_000)
    body = bytearray(_botocore_body(data, name, cls, 65536))
    body[50_000] ^= 0xFF
    dec = AwsChunkedDecoder(UNSIGNED_TRAILER, checksum=f"x-amz-checksum-{name}")
    with pytest.raises(AuthError) as e:
        dec.feed(bytes(body))
        dec.finish()
    assert (e.value.code, e.value.http_status) == ("BadDigest", 400)


def test_unknown_checksum_algorithms_pass_through() -> None:
    crc = base64.b64encode(zlib.crc32(b"abc").to_bytes(4, "big")).decode()
    body = f"3\r\nabc\r\n0\r\nx-amz-checksum-crc32c:{crc}\r\n\r\n".encode()
    out, trailers = _decode(AwsChunkedDecoder(UNSIGNED_TRAILER, checksum="crc32c"), body, 5)
    assert out == b"abc" and trailers == {"x-amz-checksum-crc32c": crc}


def test_empty_body_and_no_verified_request() -> None:
    out, trailers = _decode(AwsChunkedDecoder(None, decoded_length=0), b"0\r\n\r\n", 1)
    assert (out, trailers) == (b"", {})


@pytest.mark.parametrize("which", ["unsigned", "signed", "signed-trailer"])
def test_mangled_bodies_fail_only_with_auth_errors(which: str) -> None:
    """Random byte edits, deletions and insertions give an AuthError or a clean decode,
    never another exception."""
    rnd = random.Random(which)
    base, verified = {
        "unsigned": (_botocore_body(b"x" * 3000, "crc32", Crc32Checksum, 1000), UNSIGNED_TRAILER),
        "signed": (BODY, SIGNED),
        "signed-trailer": (TRAILER_BODY, SIGNED_TRAILER),
    }[which]
    for _ in range(150):
        body = bytearray(base)
        pos = rnd.randrange(len(body))
        if rnd.random() < 0.5:
            body[pos] = rnd.randrange(256)
        else:
            body[pos : pos + rnd.randint(0, 4)] = bytes(rnd.choices(b"\r\n;:=0fF-a ", k=2))
        dec = AwsChunkedDecoder(verified, checksum="crc32")
        with contextlib.suppress(AuthError):
            _decode(dec, bytes(body), rnd.choice([97, 4096, 10**6]))

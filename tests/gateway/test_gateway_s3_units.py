"""The S3 gateway's pure parts: listing pages, tokens, ranges, conditions, ETags,
CompleteMultipartUpload bodies, key checks and the error table."""

from __future__ import annotations

import random

import pytest

from shoal.core.manifest import Entry, Manifest
from shoal.errors import CODES, PathOutsideDataset
from shoal.gateway.s3 import check_key, parse_query
from shoal.gateway.s3_listing import KeyIndex, after, decode_token, encode_token, list_page
from shoal.gateway.s3_objects import conditions, parse_range
from shoal.gateway.s3_xml import S3_CODES, S3Error, etag_of, parse_complete


def _index(keys: list[str]) -> KeyIndex:
    return KeyIndex.from_manifest(Manifest("ds", [Entry(k, 1, "v", 0.0) for k in keys]))


def _reference(keys: list[str], prefix: str, delim: str) -> list[str]:
    """What S3 lists (keys and common prefixes, in order) by brute force."""
    out: list[str] = []
    for k in sorted(keys):
        if not k.startswith(prefix):
            continue
        j = k.find(delim, len(prefix)) if delim else -1
        item = k[: j + len(delim)] if j >= 0 else k
        if not out or out[-1] != item:
            out.append(item)
    return out


def _pages(index: KeyIndex, prefix: str, delim: str, max_keys: int) -> list[str]:
    got: list[str] = []
    start = ""
    for _ in range(10_000):
        page = list_page(index, prefix, delim, start, max_keys)
        items = sorted([k for k, _ in page.contents] + page.prefixes)
        got += items
        assert len(items) <= max_keys
        if not page.truncated:
            return got
        assert page.resume is not None
        start = decode_token(encode_token(page.resume))
    raise AssertionError("listing did not end")


@pytest.mark.parametrize("seed", range(6))
def test_paging_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    parts = ["a", "b", "ab", "a-b", "é", "z"]
    keys = sorted(
        {"/".join(rng.choice(parts) for _ in range(rng.randint(1, 4))) for _ in range(300)}
    )
    index = _index(keys)
    for prefix in ("", "a", "a/", "ab/", "é/"):
        for delim in ("", "/", "-"):
            for max_keys in (1, 3, 1000):
                assert _pages(index, prefix, delim, max_keys) == _reference(keys, prefix, delim)


def test_start_after_a_common_prefix_skips_its_group() -> None:
    index = _index(["a/1", "a/2", "b/1", "c"])
    page = list_page(index, "", "/", after("a/", "", "/"), 1000)
    assert page.prefixes == ["b/"] and [k for k, _ in page.contents] == ["c"]
    page = list_page(index, "", "", after("a/1", "", ""), 1000)
    assert [k for k, _ in page.contents] == ["a/2", "b/1", "c"]
    assert list_page(index, "", "", "", 0).truncated is False


@pytest.mark.parametrize("token", ["", "!!!", "bm90LWEtdG9rZW4=", "\u00e9"])
def test_bad_tokens(token: str) -> None:
    with pytest.raises(S3Error) as e:
        decode_token(token)
    assert (e.value.code, e.value.status) == ("InvalidArgument", 400)


@pytest.mark.parametrize(
    "header, size, want",
    [
        (None, 10, None),
        ("bytes=0-0", 10, (0, 1)),
        ("bytes=2-", 10, (2, 8)),
        ("bytes=-3", 10, (7, 3)),
        ("bytes=-30", 10, (0, 10)),
        ("bytes=5-100", 10, (5, 5)),
        ("bytes=5-2", 10, None),
        ("bytes=0-1,4-5", 10, None),
        ("items=0-1", 10, None),
        ("bytes=0-", 0, None),
    ],
)
def test_ranges(header: str | None, size: int, want: tuple[int, int] | None) -> None:
    assert parse_range(header, size) == want


@pytest.mark.parametrize("header", ["bytes=10-", "bytes=10-20", "bytes=-0"])
def test_unsatisfiable(header: str) -> None:
    with pytest.raises(S3Error) as e:
        parse_range(header, 10)
    assert e.value.status == 416 and e.value.headers == {"Content-Range": "bytes */10"}


def test_conditions() -> None:
    etag, mtime = '"abc"', 1_000_000.0
    assert conditions({}, etag, mtime) is None
    assert conditions({"If-Match": '"abc"'}, etag, mtime) is None
    assert conditions({"If-Match": '"x", W/"abc"'}, etag, mtime) is None
    assert conditions({"If-Match": "*"}, etag, mtime) is None
    assert conditions({"If-Match": '"x"'}, etag, mtime) == 412
    assert conditions({"If-None-Match": '"abc"'}, etag, mtime) == 304
    assert conditions({"If-None-Match": '"x"'}, etag, mtime) is None
    late, early = "Mon, 12 Jan 1970 13:46:40 GMT", "Thu, 01 Jan 1970 00:00:00 GMT"
    assert conditions({"If-Modified-Since": late}, etag, mtime) == 304
    assert conditions({"If-Modified-Since": early}, etag, mtime) is None
    assert conditions({"If-Unmodified-Since": early}, etag, mtime) == 412
    # If-Match decides alone over If-Unmodified-Since; If-None-Match over If-Modified-Since
    assert conditions({"If-Match": '"abc"', "If-Unmodified-Since": early}, etag, mtime) is None
    assert conditions({"If-None-Match": '"x"', "If-Modified-Since": late}, etag, mtime) is None
    assert conditions({"If-Modified-Since": "garbage"}, etag, mtime) is None


def test_etags() -> None:
    md5 = "d41d8cd98f00b204e9800998ecf8427e"
    assert etag_of(md5) == f'"{md5}"'
    assert etag_of(md5 + "-12") == f'"{md5}-12"'
    other = etag_of("1234-1700000000000000000")
    assert other == etag_of("1234-1700000000000000000") and other.endswith('-1"')
    assert other != etag_of("1234-1700000000000000001")


def test_complete_bodies() -> None:
    body = (
        b'<CompleteMultipartUpload xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        b'<Part><PartNumber>1</PartNumber><ETag>"aa"</ETag></Part>'
        b"<Part><ETag>bb</ETag><PartNumber>2</PartNumber></Part></CompleteMultipartUpload>"
    )
    assert parse_complete(body) == [(1, "aa"), (2, "bb")]
    for bad in (
        b"",
        b"<CompleteMultipartUpload>",
        b"<CompleteMultipartUpload/>",
        b"<Other><Part><PartNumber>1</PartNumber><ETag>a</ETag></Part></Other>",
        b"<CompleteMultipartUpload><Part><PartNumber>x</PartNumber><ETag>a</ETag></Part>"
        b"</CompleteMultipartUpload>",
        b'<!DOCTYPE a [<!ENTITY e "x">]><CompleteMultipartUpload/>',
    ):
        with pytest.raises(S3Error) as e:
            parse_complete(bad)
        assert e.value.code == "MalformedXML"


@pytest.mark.parametrize("key", ["a/../b", "../a", "a/./b", "a//b", "./a"])
def test_traversal_keys(key: str) -> None:
    with pytest.raises(PathOutsideDataset):
        check_key(key)


def test_keys_accepted_and_refused() -> None:
    for ok in ("data/a.bin", "data/dir/", "data/sp ace+ü%.txt", "data/..hidden", "data/a..b"):
        check_key(ok)
    for bad, code in (("data/\x00", "InvalidArgument"), ("data/\n", "InvalidArgument"),
                      ("d/" + "x" * 1024, "KeyTooLongError")):  # fmt: skip
        with pytest.raises(S3Error) as e:
            check_key(bad)
        assert e.value.code == code


def test_query_and_error_table() -> None:
    assert parse_query("list-type=2&prefix=a%20b+c&uploads&x=1&x=2") == {
        "list-type": "2",
        "prefix": "a b+c",
        "uploads": "",
        "x": "1",
    }
    assert set(CODES) <= set(S3_CODES)  # every shoal error has its S3 code

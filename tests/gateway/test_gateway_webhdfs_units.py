"""The WebHDFS gateway's pure parts, without a cluster: the checksum fed in any
chunking, block arithmetic, path and parameter parsing, tokens and the access rules."""

from __future__ import annotations

import random

import pytest
from test_gateway_webhdfs_api import hdfs_checksum

from shoal.errors import CredentialsError, InvalidArgument, NotFound, PermissionDenied
from shoal.gateway.auth import Credentials
from shoal.gateway.webhdfs_auth import Access, make_token
from shoal.gateway.webhdfs_json import BadPath, HdfsChecksum, blocks, from_error
from shoal.gateway.webhdfs_req import parse_target


@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 4096, 4097, 3 * 4096 + 700])
def test_checksum_does_not_depend_on_chunking(size: int) -> None:
    rng = random.Random(size)
    data = rng.randbytes(size)
    whole = HdfsChecksum(4096)
    whole.update(data)
    pieces = HdfsChecksum(4096)
    pos = 0
    while pos < size:
        n = rng.choice([1, 7, 511, 512, 1000, 4096, 5000])
        pieces.update(data[pos : pos + n])
        pos += n
    a, b = whole.result()["FileChecksum"], pieces.result()["FileChecksum"]
    assert a == b and a["bytes"] == hdfs_checksum(data, 4096) and a["length"] == 28
    assert a["algorithm"] == f"MD5-of-{8 if size > 4096 else 0}MD5-of-512CRC32C"


def test_blocks() -> None:
    assert blocks(0, 100 * 512, 0, -1) == []
    assert blocks(10, 512, 0, -1) == [(0, 10)]
    assert blocks(1300, 512, 0, -1) == [(0, 512), (512, 512), (1024, 276)]
    assert blocks(1300, 512, 600, 10) == [(512, 512)]
    assert blocks(1300, 512, 500, 100) == [(0, 512), (512, 512)]
    assert blocks(1300, 512, 5000, 10) == []


def test_parse_target() -> None:
    assert parse_target("/webhdfs/v1/ds/m/a%20b/c?OP=open&Offset=5") == (
        "/ds/m/a b/c",
        {"op": "open", "offset": "5"},
    )
    assert parse_target("/webhdfs/v1?op=LISTSTATUS")[0] == "/"
    assert parse_target("/webhdfs/v1/ds//m/?op=X")[0] == "/ds/m"
    assert parse_target("/webhdfs/v1/ds/ü?op=X")[0] == "/ds/ü"
    for bad in (
        "/webhdfs/v1/ds/../x",
        "/webhdfs/v1/ds/%2E%2e/x",
        "/webhdfs/v1/ds/./x",
        "/webhdfs/v1/ds/a%00b",
        "/webhdfs/v1/ds/a%0ab",
    ):
        with pytest.raises(BadPath):
            parse_target(bad + "?op=GETFILESTATUS")
    with pytest.raises(InvalidArgument):
        parse_target("/webhdfs/v1/ds/%ff?op=X")
    with pytest.raises(InvalidArgument):
        parse_target("/webhdfs/v1/ds?" + "&".join(f"p{i}=1" for i in range(40)))
    with pytest.raises(NotFound):
        parse_target("/webhdfs/v2/ds")
    with pytest.raises(NotFound):
        parse_target("/webhdfs/v1x/ds")
    assert from_error(BadPath("x"))[1]["RemoteException"]["exception"] == "InvalidPathException"


def _creds() -> Credentials:
    return Credentials.from_dict(
        {
            "public": ["open"],
            "users": {
                "alice": {
                    "role": "write",
                    "datasets": ["a"],
                    "keys": [{"access_key": "AKA", "secret": "s3cret-a"}],
                },
                "bob": {"role": "read", "datasets": ["b"]},
            },
        }
    )


def test_tokens() -> None:
    access = Access(_creds(), writable=frozenset({"a"}))
    tok = make_token("AKA", "s3cret-a", 60, now=1000.0)
    assert access.who({"delegation": tok}, now=1030.0).name == "alice"
    for bad, now in (
        (tok, 2000.0),  # expired
        (tok[:-2] + "xx", 1030.0),  # forged
        (make_token("AKA", "wrong", 60, now=1000.0), 1030.0),
        ("AKB." + tok.split(".", 1)[1], 1030.0),  # another key
        ("nonsense", 1030.0),
        ("x" * 1000, 1030.0),
    ):
        with pytest.raises(CredentialsError) as e:
            access.who({"delegation": bad}, now=now)
        assert "s3cret" not in str(e.value) and bad not in str(e.value)


def test_access_rules() -> None:
    strict = Access(_creds(), writable=frozenset({"a"}))
    trusting = Access(_creds(), trust_user_name=True, writable=frozenset({"a"}))
    assert strict.who({"user.name": "bob"}).identity is None  # not trusted: anonymous
    bob = trusting.who({"user.name": "bob"})
    assert bob.name == "bob"
    trusting.check_read(bob, "b")
    trusting.check_read(bob, "open")
    with pytest.raises(PermissionDenied):
        trusting.check_read(bob, "a")
    with pytest.raises(PermissionDenied):
        trusting.check_write(bob, "b")
    anon = trusting.who({"user.name": "nobody"})
    assert anon.identity is None and trusting.can_list(anon, "open")
    with pytest.raises(PermissionDenied):
        trusting.check_read(anon, "b")
    alice = trusting.who({"delegation": make_token("AKA", "s3cret-a", 60)})
    trusting.check_write(alice, "a")
    with pytest.raises(PermissionDenied):
        Access(_creds(), writable=frozenset()).check_write(alice, "a")  # not --writable

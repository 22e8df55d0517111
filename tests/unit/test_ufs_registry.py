"""The scheme registry, option validation and URI redaction (no I/O)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.core.types import Mount
from shoal.errors import InvalidArgument
from shoal.ufs import UnderStore, open_store, register
from shoal.ufs.fsspec_driver import FsspecStore
from shoal.ufs.local import LocalStore
from shoal.ufs.paths import clean_rel, redact_uri, version_of
from shoal.ufs.s3 import S3Store
from shoal.ufs.webhdfs import WebHdfsStore


def test_builtin_schemes(tmp_path: Path) -> None:
    assert isinstance(open_store(Mount("m", str(tmp_path))), LocalStore)
    assert isinstance(open_store(Mount("m", f"file://{tmp_path}")), LocalStore)
    assert isinstance(open_store(Mount("m", "s3://bucket/prefix")), S3Store)
    assert isinstance(open_store(Mount("m", "webhdfs://nn:9870/data")), WebHdfsStore)
    mem = open_store(Mount("m", "memory://x/y"))
    assert isinstance(mem, FsspecStore) and mem.describe() == "memory://x/y"


def test_unknown_scheme_is_one_line_invalid_argument() -> None:
    with pytest.raises(InvalidArgument) as err:
        open_store(Mount("m", "nosuchproto://a/b"))
    assert "nosuchproto" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("uri", ["s3://bucket/p", "webhdfs://nn/p", "memory://x", "/tmp"])
def test_unknown_option_is_named(uri: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        open_store(Mount("m", uri, {"endpoint_urll": "http://x"}))
    assert "endpoint_urll" in str(err.value)


def test_bad_option_values() -> None:
    with pytest.raises(InvalidArgument, match="anon"):
        open_store(Mount("m", "s3://b", {"anon": "maybe"}))
    with pytest.raises(InvalidArgument, match="addressing"):
        open_store(Mount("m", "s3://b", {"addressing": "sideways"}))
    with pytest.raises(InvalidArgument, match="kerberos"):
        open_store(Mount("m", "webhdfs://nn/p", {"kerberos": "true"}))
    with pytest.raises(InvalidArgument, match="absolute"):
        open_store(Mount("m", "file://relative/path"))


def test_register_a_driver() -> None:
    made: list[Mount] = []

    def factory(mount: Mount) -> UnderStore:
        made.append(mount)
        return open_store(Mount(mount.name, "memory://custom"))

    register("shoaltestproto", factory)
    store = open_store(Mount("m", "shoaltestproto://anything"))
    assert made and store.describe() == "memory://custom"


def test_credentials_in_uris_are_refused_without_echo() -> None:
    for uri in ("s3://AKIAXX:hunter22@bucket/p", "webhdfs://alice:hunter22@nn:50070/data"):
        with pytest.raises(InvalidArgument) as err:
            open_store(Mount("m", uri))
        assert "hunter22" not in str(err.value)
    web = open_store(Mount("m", "webhdfs://alice@nn:50070/data"))
    assert web.describe() == "webhdfs://nn:50070/data" and "alice" not in repr(web)
    assert open_store(Mount("m", "s3://bucket/p/")).describe() == "s3://bucket/p"


def test_paths_and_versions() -> None:
    assert clean_rel("/a//b/./c/") == "a/b/c"
    assert clean_rel("") == ""
    with pytest.raises(InvalidArgument):
        clean_rel("a/../../b")
    assert redact_uri("s3://k:s@b/p?x=1") == "s3://b/p"
    assert version_of({"ETag": '"abc-2"'}, 1, 0.0) == "abc-2"
    assert version_of({}, 5, 1.5) == "5-1500000000"

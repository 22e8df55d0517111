import pytest

from shoal.core.types import (
    NEVER,
    CachePolicy,
    Dataset,
    Mount,
    parse_duration,
    parse_size,
    split_path,
)
from shoal.errors import InvalidArgument, PathOutsideDataset


def test_policy_options_parse_and_validate() -> None:
    p = CachePolicy().with_options(
        {
            "replicas": "2",
            "page_size": "4MiB",
            "staleness": "30s",
            "ttl": "1d",
            "pin": "true",
            "tiers": "mem,ssd",
        }
    )
    assert (p.replicas, p.page_size, p.staleness, p.ttl, p.pin, p.tiers) == (
        2,
        4 << 20,
        30.0,
        86400.0,
        True,
        ("mem", "ssd"),
    )
    assert CachePolicy().staleness == NEVER
    for bad in (
        {"replicas": "0"},
        {"page_size": "3000"},
        {"eviction": "random"},
        {"nosuch": "1"},
        {"pin": "maybe"},
        {"ttl": "soon"},
    ):
        with pytest.raises(InvalidArgument):
            CachePolicy().with_options(bad)


def test_round_trip() -> None:
    d = Dataset(
        "imagenet",
        (
            Mount("train", "s3://b/train", {"endpoint_url": "http://x"}),
            Mount("labels", "file:///tmp/l"),
        ),
        CachePolicy(replicas=2),
    )
    assert Dataset.from_dict(d.to_dict()) == d


def test_mount_rejects_secrets_and_bad_uris() -> None:
    with pytest.raises(InvalidArgument, match="secret"):
        Mount("m", "s3://b", {"aws_secret_access_key": "x"})
    with pytest.raises(InvalidArgument, match="malformed URI"):
        Mount("m", "bucket-without-scheme")
    with pytest.raises(InvalidArgument):
        Dataset("bad name", (Mount("m", "s3://b"),))


def test_split_path() -> None:
    p = split_path("/ds/train/a/b.jpg")
    assert (p.dataset, p.mount, p.rel, p.key_path) == ("ds", "train", "a/b.jpg", "train/a/b.jpg")
    assert split_path("shoal://ds/train").key_path == "train"
    with pytest.raises(PathOutsideDataset):
        split_path("/ds/train/../../etc/passwd")
    with pytest.raises(PathOutsideDataset):
        split_path("/")


def test_sizes_and_durations() -> None:
    assert parse_size("1GiB") == 1 << 30 and parse_size("64k") == 65536
    assert parse_duration("5m") == 300 and parse_duration("never") == NEVER
    with pytest.raises(InvalidArgument):
        parse_size("lots")


def test_file_info_mtime_nanoseconds_survive_copies_and_the_wire() -> None:
    from dataclasses import replace

    from shoal.core.types import FileInfo

    ns = 1_700_000_000_123_456_789  # a float holds this only to ~240 ns
    a = FileInfo("a", 1, "v", mtime_ns=ns)
    assert a.mtime_ns == ns and abs(a.mtime - ns / 1e9) < 1e-6
    # layers that copy the float field into a new FileInfo keep the nanoseconds
    assert FileInfo("b", 1, "v", a.mtime, False).mtime_ns == ns
    assert FileInfo.from_wire(a.to_wire()) == a
    assert FileInfo.from_wire(a.to_wire()[:5]).mtime_ns // 1000 == ns // 1000  # old peers
    old = FileInfo("c", 1, "v", 1.5)  # a float only: nanoseconds derived
    assert old.mtime == 1.5 and old.mtime_ns == 1_500_000_000
    assert replace(a, mtime=2.0).mtime_ns == 2_000_000_000
    assert replace(a, mtime_ns=5).mtime_ns == 5
    assert FileInfo("d", 0, "").mtime_ns == 0
    import json
    import pickle

    assert json.loads(json.dumps(a.mtime)) == float(a.mtime)
    assert pickle.loads(pickle.dumps(a)) == a

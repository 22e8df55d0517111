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

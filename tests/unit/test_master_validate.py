"""Request-body validation: every bad body is one InvalidArgument, never a 500."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.core.types import NEVER, CachePolicy
from shoal.errors import InvalidArgument
from shoal.master import validate


def test_parse_dataset_defaults_and_policy() -> None:
    d = validate.parse_dataset(
        {
            "name": "imagenet",
            "mounts": [{"name": "train", "uri": "s3://b/train", "options": {"anon": "true"}}],
            "policy": {"replicas": 2, "page_size": "4MiB", "staleness": "5m", "tiers": ["ssd"]},
            "generation": 9,
        }
    )
    assert d.name == "imagenet" and d.generation == 1
    assert d.mounts[0].options == {"anon": "true"}
    assert d.policy.replicas == 2 and d.policy.page_size == 4 << 20
    assert d.policy.staleness == 300 and d.policy.tiers == ("ssd",)


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        {"mounts": [{"name": "m", "uri": "s3://b"}]},
        {"name": "d"},
        {"name": "d", "mounts": "s3://b"},
        {"name": "d", "mounts": []},
        {"name": "d", "mounts": [{"name": "m"}]},
        {"name": "d", "mounts": [{"name": "m", "uri": "s3://b", "options": {"a": 1}}]},
        {"name": "d", "mounts": [{"name": "m", "uri": "s3://b", "options": {"secret": "x"}}]},
        {"name": "d", "mounts": [{"name": "m", "uri": "nope"}]},
        {"name": "bad name", "mounts": [{"name": "m", "uri": "s3://b"}]},
        {"name": "d", "mounts": [{"name": "m", "uri": "s3://b"}], "extra": 1},
        {"name": "d", "mounts": [{"name": "m", "uri": "s3://b"}], "policy": {"replica": 2}},
    ],
)
def test_parse_dataset_rejects(body: Any) -> None:
    with pytest.raises(InvalidArgument):
        validate.parse_dataset(body)


@pytest.mark.parametrize(
    "changes",
    [
        {"replicas": "x"},
        {"replicas": 2.5},
        {"replicas": True},
        {"replicas": 0},
        {"ttl": "soon"},
        {"ttl": [1]},
        {"pin": 1},
        {"tiers": "ssd,bogus"},
        {"tiers": [1]},
        {"placement": 3},
        {"placement": "random"},
        {"page_size": 1000},
        {"unknown": 1},
        "replicas=2",
    ],
)
def test_apply_policy_rejects(changes: Any) -> None:
    with pytest.raises(InvalidArgument):
        validate.apply_policy(CachePolicy(), changes)


def test_apply_policy_partial_keeps_the_rest() -> None:
    base = CachePolicy(replicas=3, readahead=16)
    p = validate.apply_policy(base, {"pin": True, "staleness": "never", "tiers": "mem,ssd"})
    assert p.replicas == 3 and p.readahead == 16 and p.pin
    assert p.staleness == NEVER and p.tiers == ("mem", "ssd")


def test_parse_register_tolerates_extra_keys() -> None:
    w = validate.parse_register(
        {
            "id": "w-1",
            "host": "h",
            "port": 1,
            "uds": None,
            "node": "n",
            "metrics_port": 9,
            "tiers": [{"name": "ssd", "path": "/c", "capacity": 10}],
        }
    )
    assert w.id == "w-1" and w.uds == "" and w.tiers[0].capacity == 10 and w.tls is False
    body = {"id": "w-1", "host": "h", "port": 1, "tls": True}
    assert validate.parse_register(body).tls is True


@pytest.mark.parametrize(
    "body",
    [
        {"host": "h", "port": 1},
        {"id": "w", "host": "h", "port": "1"},
        {"id": "w", "host": "h", "port": 1, "tiers": {}},
        {"id": "w", "host": "h", "port": 1, "tiers": [{"name": "ssd"}]},
        {"id": "w", "host": "h", "port": 1, "tls": "yes"},
    ],
)
def test_parse_register_rejects(body: Any) -> None:
    with pytest.raises(InvalidArgument):
        validate.parse_register(body)


def test_parse_heartbeat() -> None:
    assert validate.parse_heartbeat(None) is None
    assert validate.parse_heartbeat({}) is None
    assert validate.parse_heartbeat({"stats": {"a": 1}}) == {"a": 1}
    with pytest.raises(InvalidArgument):
        validate.parse_heartbeat({"stats": [1]})


@pytest.mark.parametrize(
    "policy", [{"ttl": float("inf")}, {"staleness": float("nan")}, {"ttl": "1e999"}]
)
def test_policy_numbers_must_be_finite(policy: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        validate.apply_policy(CachePolicy(), policy)


@pytest.mark.parametrize(
    ("raw", "word"),
    [
        (b'{"ttl": NaN}', "NaN"),
        (b'{"ttl": -Infinity}', "Infinity"),
        (b'{"ttl": 1e999}', "out of range"),
        (b"[" * 100_000 + b"]" * 100_000, "nested"),
        (b"[" * 65 + b"]" * 65, "nested"),
        (b"\xff", "malformed"),
    ],
)
def test_parse_json_is_strict(raw: bytes, word: str) -> None:
    with pytest.raises(InvalidArgument, match=word):
        validate.parse_json(raw)


def test_parse_json_accepts_ordinary_bodies() -> None:
    assert validate.parse_json(b'{"a": [1, 2.5, {"b": "[[["}]}') == {"a": [1, 2.5, {"b": "[[["}]}


def _ds(uri: str) -> dict[str, Any]:
    return {"name": "d", "mounts": [{"name": "m", "uri": uri}]}


@pytest.mark.parametrize(
    ("uri", "roots", "word"),
    [
        ("file:///data/x", (), "--file-root"),
        ("/data/x", (), "--file-root"),
        ("file:///etc", ("/data",), "outside"),
        ("file:///", ("/data",), "outside"),
        ("file:///data/../etc", ("/data",), "outside"),
        ("file:///database", ("/data",), "outside"),  # a prefix of the name is not a parent
        ("local:///etc", ("/data",), "outside"),
        ("simplecache::file:///etc", ("/data",), "outside"),
        ("file://relative/x", ("/data",), "absolute"),
        ("s3://b\x00x", None, "control character"),
        ("file:///data/a\nb", ("/data",), "control character"),
    ],
)
def test_mount_uris_refused(uri: str, roots: tuple[str, ...] | None, word: str) -> None:
    with pytest.raises(InvalidArgument, match=word):
        validate.parse_dataset(_ds(uri), roots)


@pytest.mark.parametrize(
    ("uri", "roots"),
    [
        ("file:///data", ("/data",)),
        ("file:///data/sub/x", ("/data", "/other")),
        ("file://localhost/data/x", ("/data",)),
        ("file:///etc", None),  # callers other than the master's API skip the rule
        ("s3://bucket/x", ()),
    ],
)
def test_mount_uris_allowed(uri: str, roots: tuple[str, ...] | None) -> None:
    assert validate.parse_dataset(_ds(uri), roots).mounts[0].uri == uri


@pytest.mark.parametrize("url", ["notaurl", "ftp://h", "http://", "http://h:99999", "http://h:x"])
def test_endpoint_url_refused(url: str) -> None:
    body = {
        "name": "d",
        "mounts": [{"name": "m", "uri": "s3://b", "options": {"endpoint_url": url}}],
    }
    with pytest.raises(InvalidArgument, match="endpoint_url"):
        validate.parse_dataset(body)


def test_endpoint_url_allowed() -> None:
    body = {
        "name": "d",
        "mounts": [{"name": "m", "uri": "s3://b", "options": {"endpoint_url": "https://h:9000"}}],
    }
    assert validate.parse_dataset(body).mounts[0].options["endpoint_url"] == "https://h:9000"

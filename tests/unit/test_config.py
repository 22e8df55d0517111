"""Settings validate themselves where they are built: a bad value is a one-line
InvalidArgument at construction, never a late failure deep in a server."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from shoal.config import (
    ENV_MASTER,
    ClientSettings,
    MasterSettings,
    TierSpec,
    WorkerSettings,
    master_from_env,
)
from shoal.errors import InvalidArgument

M = "http://127.0.0.1:1"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pool_size": 0}, "pool_size must be at least 1"),
        ({"pool_size": 2.5}, "pool_size must be an integer"),
        ({"request_timeout": -1}, "request_timeout must be a positive number"),
        ({"request_timeout": math.nan}, "request_timeout must be a positive number"),
        ({"ring_refresh": 0}, "ring_refresh must be a positive number"),
        ({"ring_refresh": math.inf}, "ring_refresh must be a positive number"),
        ({"master": ""}, "no master URL"),
    ],
)
def test_client_settings_refuse_bad_values(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"master": M}
    with pytest.raises(InvalidArgument, match=message):
        ClientSettings(**{**base, **kwargs})  # type: ignore[arg-type]


def test_good_settings_build() -> None:
    assert ClientSettings(master=M, pool_size=1, request_timeout=0.5).pool_size == 1
    assert MasterSettings(port=19999).port == 19999
    tier = TierSpec.parse("ssd:/tmp/x:1GiB")
    assert WorkerSettings(master=M, tiers=(tier,)).tiers == (tier,)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"port": 70000}, "port must be 0..65535"),
        ({"port": -1}, "port must be 0..65535"),
        ({"heartbeat_interval": 0}, "heartbeat_interval must be a positive number"),
        ({"worker_expiry": 1.0, "heartbeat_interval": 2.0}, "worker_expiry must be longer"),
    ],
)
def test_master_settings_refuse_bad_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        MasterSettings(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ufs_concurrency": 0}, "ufs_concurrency must be at least 1"),
        ({"port": 65536}, "port must be 0..65535"),
        (
            {"tiers": (TierSpec.parse("ssd:/a:1GiB"), TierSpec.parse("ssd:/b:1GiB"))},
            "each tier may be given once",
        ),
        ({"drain_timeout": -1.0}, "drain_timeout must be a positive number"),
        ({"drain_timeout": float("inf")}, "drain_timeout must be a positive number"),
        ({"drain_timeout": "60"}, "drain_timeout must be a number"),
    ],
)
def test_worker_settings_refuse_bad_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        WorkerSettings(master=M, **kwargs)  # type: ignore[arg-type]


def test_missing_master_says_how_to_pass_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_MASTER, raising=False)
    with pytest.raises(InvalidArgument) as lib:
        master_from_env(None)
    assert ENV_MASTER in str(lib.value) and "master=URL" in str(lib.value)
    assert "--master" not in str(lib.value)
    with pytest.raises(InvalidArgument, match="--master URL"):
        master_from_env(None, hint="pass --master URL")
    monkeypatch.setenv(ENV_MASTER, "127.0.0.1:5/")
    assert master_from_env(None) == "http://127.0.0.1:5"


def test_one_place_resolves_shoal_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from shoal.cli.local import default_dir
    from shoal.config import shoal_home
    from shoal.fuse.service import default_state_dir

    monkeypatch.setenv("SHOAL_HOME", str(tmp_path))
    assert shoal_home() == tmp_path
    assert default_dir() == tmp_path / "cluster"
    assert default_state_dir() == tmp_path / "mounts"
    monkeypatch.delenv("SHOAL_HOME")
    assert shoal_home() == Path.home() / ".shoal"


def test_the_tls_ca_is_explicit_then_the_environment_then_what_shoal_up_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shoal.cli.tokens import forget_credentials, save_credentials
    from shoal.config import tls_ca_for

    monkeypatch.setenv("SHOAL_HOME", str(tmp_path))
    monkeypatch.delenv("SHOAL_TLS_CA", raising=False)
    url = "https://127.0.0.1:5"
    assert tls_ca_for(None, url) is None
    save_credentials(url, "tok", "/c/ca.pem")
    assert tls_ca_for(None, f"http://x:1,{url}/") == "/c/ca.pem"  # any of the masters
    assert tls_ca_for(None) is None and tls_ca_for(None, "https://other:5") is None
    monkeypatch.setenv("SHOAL_TLS_CA", "/env/ca.pem")
    assert tls_ca_for(None, url) == "/env/ca.pem"
    assert tls_ca_for("/mine.pem", url) == "/mine.pem"
    monkeypatch.delenv("SHOAL_TLS_CA")
    forget_credentials(url)
    assert tls_ca_for(None, url) is None
    assert (tmp_path / "credentials.json").read_text().strip() == "{}"

"""Fixtures shared by every test: a moto S3 server per session and real clusters."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.testing.cluster import TestCluster, s3_env, start_cluster
from shoal.testing.s3 import MotoServer

_bucket_ids = itertools.count()


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="session", autouse=False)
def s3_credentials() -> Iterator[None]:
    with s3_env():
        yield


@pytest.fixture
def bucket() -> str:
    """A fresh bucket name per test."""
    return f"test-{next(_bucket_ids)}"


@pytest.fixture(scope="module")
def module_cluster(
    tmp_path_factory: pytest.TempPathFactory, s3_credentials: None
) -> Iterator[TestCluster]:
    """A master and two workers shared by the tests of one module (read-only tests)."""
    c = start_cluster(tmp_path_factory.mktemp("cluster"), workers=2)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def cluster(tmp_path: Path, s3_credentials: None) -> Iterator[TestCluster]:
    """A master and two workers as real processes on free ports, each with a memory
    tier (/dev/shm) above its disk tier, so the tiered store is exercised end to end."""
    c = start_cluster(tmp_path / "cluster", workers=2, mem="128MiB")
    try:
        yield c
    finally:
        c.stop()

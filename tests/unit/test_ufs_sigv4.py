"""shoal.ufs.sigv4 signs exactly as botocore's S3SigV4Auth does, for the same clock:
object GETs with odd keys, ranged and conditional, listing queries, session tokens,
default and explicit ports, IPv6 hosts; and the signing key follows the day."""

from __future__ import annotations

import datetime as dt
from urllib.parse import quote

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from shoal.ufs.s3list import list_query
from shoal.ufs.sigv4 import EMPTY_SHA256, Signer, host_of

WHEN = dt.datetime(2026, 12, 1, 23, 59, 58, tzinfo=dt.UTC)


def botocore_headers(
    url: str, headers: dict[str, str], creds: dict[str, str], region: str, when: dt.datetime
) -> dict[str, str]:
    req = AWSRequest(method="GET", url=url, headers=dict(headers))
    req.headers["X-Amz-Content-SHA256"] = EMPTY_SHA256
    auth = S3SigV4Auth(Credentials(creds["key"], creds["secret"], creds.get("token")), "s3", region)
    import botocore.auth

    saved = botocore.auth.get_current_datetime
    botocore.auth.get_current_datetime = lambda *a, **k: when.replace(tzinfo=None)
    try:
        auth.add_auth(req)
    finally:
        botocore.auth.get_current_datetime = saved
    return {k.lower(): v for k, v in req.headers.items()}


CREDS = [
    {"key": "AKIAFAKE", "secret": "s3cr3t/with+odd=chars"},
    {"key": "ASIAFAKE", "secret": "other", "token": "tok en//+=="},
]
KEYS = [
    "plain.bin",
    "dir/sub/f000123.bin",
    "spaces and ünïcode/ä b+c=d.txt",
    "~tilde-_.x",
    "%25odd&?#",
]


@pytest.mark.parametrize("creds", CREDS)
@pytest.mark.parametrize(
    "endpoint",
    ["http://127.0.0.1:9000", "https://s3.example.com", "http://[::1]:7480", "http://Host:80"],
)
@pytest.mark.parametrize("key", KEYS)
def test_object_gets_match_botocore(creds: dict[str, str], endpoint: str, key: str) -> None:
    path = "/bkt/" + quote(key, safe="/~")
    headers = {"Range": "bytes=0-1048575", "If-Match": '"abc123"'}
    mine = Signer(host_of(endpoint), "eu-west-2", creds, clock=lambda: WHEN).sign(path, "", headers)
    theirs = botocore_headers(endpoint + path, headers, creds, "eu-west-2", WHEN)
    assert {k.lower(): v for k, v in mine.items() if k != "Host"} == theirs


@pytest.mark.parametrize("creds", CREDS)
@pytest.mark.parametrize("token", [None, "1/ab+cd==", "x y"])
@pytest.mark.parametrize("delimiter", ["/", None])
def test_listing_queries_match_botocore(
    creds: dict[str, str], token: str | None, delimiter: str | None
) -> None:
    query = list_query("dir with space/ü+/", delimiter, token, 1000)
    mine = Signer("127.0.0.1:9000", "us-east-1", creds, clock=lambda: WHEN).sign("/bkt", query, {})
    url = f"http://127.0.0.1:9000/bkt?{query}"
    assert {k.lower(): v for k, v in mine.items() if k != "Host"} == botocore_headers(
        url, {}, creds, "us-east-1", WHEN
    )


def test_the_signing_key_follows_the_day() -> None:
    now = [WHEN]
    signer = Signer("h:1", "us-east-1", CREDS[0], clock=lambda: now[0])
    first = signer.sign("/bkt/k", "", {})
    now[0] = WHEN + dt.timedelta(seconds=5)  # past midnight: another day's key
    second = signer.sign("/bkt/k", "", {})
    assert "20261201/us-east-1" in first["Authorization"]
    assert "20261202/us-east-1" in second["Authorization"]
    want = botocore_headers("http://h:1/bkt/k", {}, CREDS[0], "us-east-1", now[0])
    assert second["Authorization"] == want["authorization"]


def test_host_header_is_what_botocore_signs() -> None:
    assert host_of("http://127.0.0.1:9000") == "127.0.0.1:9000"
    assert host_of("https://S3.Example.com:443/") == "s3.example.com"
    assert host_of("http://[::1]:7480") == "[::1]:7480"
    assert host_of("http://h:80") == "h"


def test_environment_credentials_are_taken_as_botocore_takes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a profile, the lean path reads AWS_* from the environment (botocore's
    EnvProvider comes first in its chain) instead of importing botocore.session."""
    import botocore.session

    from shoal.ufs.s3 import S3Store

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "envtoken")
    store = S3Store("s3://bkt/p", {"endpoint_url": "http://127.0.0.1:9"})
    fast = store._fast_get()
    assert fast is not None and fast._signer is not None
    frozen = botocore.session.Session().get_credentials().get_frozen_credentials()
    signer = fast._signer
    assert (signer._key, signer._secret, signer._token) == (
        frozen.access_key,
        frozen.secret_key,
        frozen.token,
    )
    assert "envsecret" not in repr(store) and "envsecret" not in store.describe()

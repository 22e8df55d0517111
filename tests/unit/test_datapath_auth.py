"""The pure parts of data-path authentication: the HELLO's token field, refusal
reasons and names for logs, and the rule for a worker that has no secret."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shoal.config import ENV_SECRET, WorkerSettings, worker_secret
from shoal.core import tokens
from shoal.core.tokens import READER, claimed_name, mint, reason, verify
from shoal.errors import InvalidArgument, ProtocolError, Unauthenticated
from shoal.proto import wire
from shoal.proto.messages import HelloRequest, decode_request_frame, encode_request
from shoal.proto.wire import Op

SECRET = b"s" * 32


def test_hello_carries_a_token_in_a_shape_every_version_reads() -> None:
    assert HelloRequest().encode() == [wire.VERSION]  # no token: as before
    h = HelloRequest(token="abc.def.ghi")
    assert h.encode() == [wire.VERSION, "abc.def.ghi"]
    _, back = decode_request_frame(encode_request(h, 7))
    assert back == h and isinstance(back, HelloRequest)
    # a worker of this version reads a HELLO from an older client (no token)...
    assert HelloRequest.decode([wire.VERSION]).token == ""
    assert HelloRequest.decode([wire.VERSION, None]).token == ""
    # ...and the version is still checked first (refuse_hello names both versions)
    assert HelloRequest.decode([1, "t"]).version == 1
    with pytest.raises(ProtocolError, match="token must be a string"):
        HelloRequest.decode([wire.VERSION, 5])
    # the token never shows in a repr (logs, tracebacks)
    assert "abc.def" not in repr(h)


def test_hello_frames_before_greeting_are_held_small() -> None:
    assert wire.MAX_HELLO < wire.MAX_REQUEST
    assert wire.HELLO_TIMEOUT > 0
    assert wire.max_request(Op.HELLO) == wire.MAX_REQUEST  # once greeted, the op's own


def test_refusal_reasons_are_bounded_labels() -> None:
    def why(token: str) -> str:
        with pytest.raises(Unauthenticated) as exc:
            verify(SECRET, token)
        return reason(exc.value)

    assert why(mint(b"o" * 32, "x", READER)) == "bad_signature"
    assert why(mint(SECRET, "x", READER, ttl=1, now=time.time() - 100)) == "expired"
    assert why("garbage") == "malformed"
    assert {why("a.b.c"), tokens.MISSING, tokens.DATASET} <= set(tokens.REASONS)


def test_claimed_name_is_the_sub_never_the_token() -> None:
    t = mint(b"o" * 32, "mallory", READER)
    assert claimed_name(t) == "'mallory'"
    assert t not in claimed_name(t)
    assert claimed_name("garbage") == "?"
    long = mint(SECRET, "n" * 200, READER)
    assert len(claimed_name(long)) <= 66


def _settings(**kw: object) -> WorkerSettings:
    return WorkerSettings(master="http://m:1", **kw)  # type: ignore[arg-type]


def test_a_worker_without_a_secret(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_SECRET, raising=False)
    # an open cluster: served unchecked
    assert worker_secret(_settings(), has_token=False, master_auth=False) is None
    assert worker_secret(_settings(), has_token=False, master_auth=None) is None
    # a cluster with auth (its master says so, or, master away, the worker holds a
    # token): refused, with what to pass
    for has_token, master_auth in ((False, True), (True, None), (True, True)):
        with pytest.raises(InvalidArgument, match=r"--secret-file.*--no-auth"):
            worker_secret(_settings(), has_token=has_token, master_auth=master_auth)
    # --no-auth: explicitly unchecked
    assert worker_secret(_settings(no_auth=True), has_token=True, master_auth=True) is None
    # a secret: from the file, else SHOAL_SECRET
    f = tmp_path / "secret"
    tokens.new_secret(f)
    got = worker_secret(_settings(secret_file=str(f)), has_token=True, master_auth=True)
    assert got == tokens.load_secret(f)
    monkeypatch.setenv(ENV_SECRET, "k" * 40)
    assert worker_secret(_settings(), has_token=True, master_auth=True) == b"k" * 40
    with pytest.raises(InvalidArgument, match="not both"):
        _settings(no_auth=True, secret_file=str(f))


def test_tls_helpers(tmp_path: Path) -> None:
    from shoal.core import tls

    assert tls.server_context(None, None) is None
    assert tls.client_context(None) is None
    with pytest.raises(InvalidArgument, match="go together"):
        tls.server_context("cert.pem", None, "worker: ")
    with pytest.raises(InvalidArgument, match="cannot load TLS certificate"):
        tls.server_context(str(tmp_path / "none.pem"), str(tmp_path / "none.key"))
    with pytest.raises(InvalidArgument, match="cannot load the TLS CA"):
        tls.client_context(str(tmp_path / "no-ca.pem"))
    # a TLS alert or handshake record, as a TLS worker may answer a plain HELLO
    assert tls.looks_like_tls(bytes([0x15, 0x03, 0x03, 0x00, 0x02]))
    assert tls.looks_like_tls(bytes([0x16, 0x03, 0x01]))
    assert not tls.looks_like_tls(wire.RESP_HDR.pack(0, 1, 0, 0, 0))  # a shoal answer
    assert issubclass(tls.TLSRefused, Unauthenticated)

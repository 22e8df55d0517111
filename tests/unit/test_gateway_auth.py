"""Gateway credentials: the file format, its one-line errors that never show a secret,
roles and dataset scopes, public datasets, and reprs without secrets."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from shoal.errors import InvalidArgument, ShoalError
from shoal.gateway.auth import ANONYMOUS, Credentials, CredentialsFileError, Identity

INLINE = "inline-Secret/with+chars=="
FROM_ENV = "env-secret-0123456789"
FROM_FILE = "file-secret-abcdef"

GOOD = """
public = ["mnist", "cifar"]

[users.alice]
role = "write"
datasets = ["imagenet", "coco"]
keys = [
  {{ access_key = "AKIAALICE0001", secret_env = "SHOAL_TEST_ALICE" }},
  {{ access_key = "AKIAALICE0002", secret_file = "{secret_file}" }},
]

[users.trainer]
role = "read"
datasets = "*"
keys = [{{ access_key = "trainer", secret = "{inline}" }}]

[users.root]
role = "admin"
datasets = "*"

[users.hdfs-reader]
role = "read"
datasets = ["imagenet"]
"""


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "alice.secret"
    path.write_text(FROM_FILE + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def good_file(tmp_path: Path, secret_file: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SHOAL_TEST_ALICE", FROM_ENV)
    path = tmp_path / "credentials.toml"
    path.write_text(GOOD.format(secret_file=secret_file, inline=INLINE))
    path.chmod(0o600)
    return path


def test_load_resolves_every_kind_of_secret(good_file: Path) -> None:
    creds = Credentials.load(good_file)
    assert creds.secret_for("AKIAALICE0001") == FROM_ENV
    assert creds.secret_for("AKIAALICE0002") == FROM_FILE  # trailing newline dropped
    assert creds.secret_for("trainer") == INLINE
    assert creds.secret_for("nobody") is None


def test_identities_carry_user_role_and_datasets(good_file: Path) -> None:
    creds = Credentials.load(good_file)
    alice = creds.identity("AKIAALICE0002")
    assert alice == Identity(
        "alice",
        "AKIAALICE0002",
        "write",
        frozenset({"imagenet", "coco"}),
        frozenset({"mnist", "cifar"}),
    )
    assert creds.identity("trainer") is not None
    assert creds.identity("nobody") is None
    assert creds.by_user("alice") == Identity(
        "alice", None, "write", frozenset({"imagenet", "coco"}), frozenset({"mnist", "cifar"})
    )
    assert creds.by_user("root") is not None and creds.by_user("root").can_admin()  # type: ignore[union-attr]
    assert creds.by_user("nobody") is None
    assert creds.by_user(ANONYMOUS) is None


def test_roles_and_dataset_scopes(good_file: Path) -> None:
    creds = Credentials.load(good_file)
    alice = creds.identity("AKIAALICE0001")
    trainer = creds.identity("trainer")
    reader = creds.by_user("hdfs-reader")
    assert alice is not None and trainer is not None and reader is not None
    assert alice.can_read("imagenet") and alice.can_write("imagenet") and alice.can_list("coco")
    assert not alice.can_read("private") and not alice.can_write("private")
    assert alice.can_read("mnist") and alice.can_list("mnist")  # public: readable by all
    assert not alice.can_write("mnist")  # but not writable through being public
    assert trainer.can_read("anything") and not trainer.can_write("anything")
    assert (
        reader.can_read("imagenet")
        and not reader.can_read("coco")
        and not reader.can_write("imagenet")
    )
    assert not alice.can_admin() and not trainer.can_admin()


def test_anonymous_reads_public_datasets_only(good_file: Path) -> None:
    creds = Credentials.load(good_file)
    anon = creds.anonymous()
    assert anon.anonymous and anon.name == ANONYMOUS and anon.access_key is None
    assert anon.can_read("mnist") and anon.can_list("cifar")
    assert not anon.can_read("imagenet") and not anon.can_list("imagenet")
    assert not anon.can_write("mnist")
    assert creds.is_public("mnist") and not creds.is_public("imagenet")
    assert not creds.is_open


def test_open_access_reads_everything_and_knows_no_key() -> None:
    creds = Credentials.open_access()
    assert creds.is_open
    anon = creds.anonymous()
    assert anon.can_read("anything") and not anon.can_write("anything")
    assert creds.is_public("anything")
    assert creds.secret_for("AKIA") is None and creds.identity("AKIA") is None
    # a normal, empty credentials set lets anonymous read nothing
    assert not Credentials.from_dict({}).anonymous().can_read("anything")


def test_check_secret_is_exact(good_file: Path) -> None:
    creds = Credentials.load(good_file)
    assert creds.check_secret("trainer", INLINE) == creds.identity("trainer")
    assert creds.check_secret("trainer", INLINE + "x") is None
    assert creds.check_secret("nobody", INLINE) is None


def test_repr_never_shows_a_secret(good_file: Path) -> None:
    creds = Credentials.load(good_file)
    for text in (
        repr(creds),
        str(creds),
        repr(creds.identity("trainer")),
        repr(creds.by_user("alice")),
    ):
        for secret in (INLINE, FROM_ENV, FROM_FILE):
            assert secret not in text
    assert "4 users" in repr(creds) and "3 keys" in repr(creds)


def test_json_file_is_the_same_structure(tmp_path: Path) -> None:
    path = tmp_path / "creds.json"
    path.write_text(
        json.dumps(
            {
                "public": ["p"],
                "users": {
                    "bob": {
                        "role": "read",
                        "datasets": ["d"],
                        "keys": [{"access_key": "BOB1", "secret": "s3cr3t"}],
                    }
                },
            }
        )
    )
    path.chmod(0o600)
    creds = Credentials.load(path)
    assert creds.secret_for("BOB1") == "s3cr3t"
    bob = creds.identity("BOB1")
    assert bob is not None and bob.can_read("d") and bob.can_read("p") and not bob.can_read("x")


def _error(data: Any) -> str:
    with pytest.raises(CredentialsFileError) as e:
        Credentials.from_dict(data, source="creds.toml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("credentials file creds.toml: ")
    assert "TOPSECRET" not in msg
    return msg


def _user(**fields: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "role": "read",
        "datasets": "*",
        "keys": [{"access_key": "K1", "secret": "TOPSECRET"}],
    }
    spec.update(fields)
    return {"users": {"u": spec}}


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ([], "top level"),
        ({"users": {}, "pubic": []}, "unknown field 'pubic'"),
        ({"public": "mnist"}, "public must be a list"),
        ({"users": []}, "users must be a table"),
        ({"users": {"a b": {"role": "read", "datasets": "*"}}}, "users.a b"),
        ({"users": {ANONYMOUS: {"role": "read", "datasets": "*"}}}, "reserved"),
        (_user(role="root"), "users.u.role must be one of read, write, admin"),
        (_user(datasets="all"), 'users.u.datasets must be "*"'),
        (_user(datasets=["a/b"]), "users.u.datasets"),
        (_user(colour="red"), "users.u: unknown field 'colour'"),
        (_user(keys={"access_key": "K"}), "users.u.keys must be a list"),
        (_user(keys=[{"access_key": "K1"}]), "users.u.keys[0]: give exactly one of"),
        (
            _user(keys=[{"access_key": "K1", "secret": "TOPSECRET", "secret_env": "X"}]),
            "exactly one",
        ),
        (_user(keys=[{"access_key": "K 1", "secret": "TOPSECRET"}]), "users.u.keys[0].access_key"),
        (
            _user(keys=[{"access_key": "K1", "secret": ""}]),
            "users.u.keys[0].secret must be a non-empty",
        ),
        (
            _user(keys=[{"access_key": "K1", "secret": "TOPSECRET", "token": "TOPSECRET"}]),
            "unknown field 'token'",
        ),
        (
            _user(
                keys=[
                    {"access_key": "K1", "secret": "TOPSECRET"},
                    {"access_key": "K1", "secret": "TOPSECRET"},
                ]
            ),
            "given twice",
        ),
        (
            _user(keys=[{"access_key": "K1", "secret_env": "SHOAL_TEST_SURELY_UNSET"}]),
            "SHOAL_TEST_SURELY_UNSET is not set",
        ),
        (
            _user(keys=[{"access_key": "K1", "secret_file": "/nonexistent/secret"}]),
            "cannot read /nonexistent/secret",
        ),
    ],
)
def test_bad_structure_is_one_line_naming_the_field(data: Any, says: str) -> None:
    assert says in _error(data)


def test_errors_are_shoal_user_errors() -> None:
    with pytest.raises(InvalidArgument) as e:
        Credentials.from_dict({"users": {"u": {"role": "x"}}})
    assert isinstance(e.value, ShoalError) and e.value.user_fault and e.value.code == "invalid"


def test_toml_syntax_error_names_the_line_not_the_content(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[users.u]\nrole = "read"\nkeys = [{ access_key = "K", secret = "TOPSECRET }]\n'
    )
    path.chmod(0o600)
    with pytest.raises(CredentialsFileError) as e:
        Credentials.load(path)
    assert "line 3" in str(e.value) and "TOPSECRET" not in str(e.value) and "\n" not in str(e.value)


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(CredentialsFileError) as e:
        Credentials.load(tmp_path / "nope.toml")
    assert "cannot read it" in str(e.value)


def test_world_readable_file_with_inline_secret_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[users.u]\nrole = "read"\ndatasets = "*"\nkeys = [{ access_key = "K", secret = "TOPSECRET" }]\n'
    )
    path.chmod(0o644)
    with pytest.raises(CredentialsFileError) as e:
        Credentials.load(path)
    assert "others may read" in str(e.value) and "TOPSECRET" not in str(e.value)
    path.chmod(0o640)  # group-readable (a Kubernetes secret with fsGroup) is fine
    assert Credentials.load(path).secret_for("K") == "TOPSECRET"


def test_world_readable_file_without_inline_secrets_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOAL_TEST_K", "from-env")
    path = tmp_path / "c.toml"
    path.write_text(
        'public = ["p"]\n[users.u]\nrole = "read"\ndatasets = "*"\nkeys = [{ access_key = "K", secret_env = "SHOAL_TEST_K" }]\n'
    )
    path.chmod(0o644)
    assert Credentials.load(path).secret_for("K") == "from-env"


def test_world_readable_secret_file_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = tmp_path / "s"
    secret.write_text("TOPSECRET")
    secret.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="shoal.gateway.auth"):
        creds = Credentials.from_dict(
            _user(keys=[{"access_key": "K1", "secret_file": str(secret)}])
        )
    assert creds.secret_for("K1") == "TOPSECRET"
    assert "read by others" in caplog.text and "TOPSECRET" not in caplog.text


def test_empty_secret_file_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("\n")
    assert "is empty" in _error(_user(keys=[{"access_key": "K1", "secret_file": str(secret)}]))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_secret_file_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("TOPSECRET")
    secret.chmod(0o000)
    assert "Permission denied" in _error(
        _user(keys=[{"access_key": "K1", "secret_file": str(secret)}])
    )

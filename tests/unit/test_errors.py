"""The one error table (shoal.errors): every class's code, errno, HTTP status and
OSError, and the front-ends (FUSE, fsspec, the master's HTTP API, the CLI) agreeing
with it."""

from __future__ import annotations

import errno
import os
from types import SimpleNamespace
from typing import Any

import pytest

from shoal import errors as e
from shoal.cli.main import exit_status
from shoal.proto import control

# class, code, errno, HTTP status, user's fault, the builtin OSError it becomes
TABLE: list[tuple[type[e.ShoalError], str, int, int, bool, type[OSError]]] = [
    (e.ShoalError, "io", errno.EIO, 500, False, OSError),
    (e.UserError, "user", errno.EINVAL, 400, True, OSError),
    (e.InvalidArgument, "invalid", errno.EINVAL, 400, True, OSError),
    (e.DatasetNotFound, "no_dataset", errno.ENOENT, 404, True, FileNotFoundError),
    (e.DatasetExists, "exists", errno.EEXIST, 409, True, FileExistsError),
    (e.PathOutsideDataset, "outside", errno.ENOENT, 404, True, FileNotFoundError),
    (e.CredentialsError, "credentials", errno.EACCES, 403, True, PermissionError),
    (e.NotFound, "not_found", errno.ENOENT, 404, True, FileNotFoundError),
    (e.PermissionDenied, "denied", errno.EACCES, 403, True, PermissionError),
    (e.Unauthenticated, "unauthenticated", errno.EACCES, 401, True, PermissionError),
    (e.IsADirectory, "is_dir", errno.EISDIR, 404, True, IsADirectoryError),
    (e.StoreError, "store", errno.EIO, 502, False, OSError),
    (e.RetryableStoreError, "store_retryable", errno.EIO, 503, False, OSError),
    (e.StoreTimeout, "store_timeout", errno.ETIMEDOUT, 504, False, TimeoutError),
    (e.FatalStoreError, "store_fatal", errno.EIO, 502, False, OSError),
    (e.Unavailable, "unavailable", errno.EHOSTUNREACH, 503, False, OSError),
    (e.CorruptData, "corrupt", errno.EIO, 500, False, OSError),
    (e.ProtocolError, "protocol", errno.EPROTO, 502, False, OSError),
    (e.StaleVersion, "stale", errno.ESTALE, 409, False, OSError),
    (e.StaleLayout, "stale_layout", errno.ESTALE, 503, False, OSError),
]
IDS = [row[0].__name__ for row in TABLE]


def test_the_table_covers_every_class_and_every_code_once() -> None:
    assert dict(e.CODES) == {row[1]: row[0] for row in TABLE}
    in_module = {v for v in vars(e).values() if isinstance(v, type) and issubclass(v, e.ShoalError)}
    assert in_module == {row[0] for row in TABLE}
    # every class is in the tree drawn in the module's docstring
    doc = e.__doc__ or ""
    for cls, code, num, status, *_ in TABLE:
        line = next(ln for ln in doc.splitlines() if f" {cls.__name__} " in ln + " ")
        assert code in line and errno.errorcode[num] in line and str(status) in line


@pytest.mark.parametrize(("cls", "code", "num", "status", "user", "oserror"), TABLE, ids=IDS)
def test_each_class(
    cls: type[e.ShoalError], code: str, num: int, status: int, user: bool, oserror: type[OSError]
) -> None:
    exc = cls("what happened")
    assert (exc.code, exc.errno, exc.http_status, exc.user_fault) == (code, num, status, user)
    assert exc.message == "what happened"
    # the wire round trip rebuilds the same class with the same message
    back = e.from_code(exc.code, exc.message)
    assert type(back) is cls and back.message == "what happened"
    # the OSError: the most specific builtin for the errno, with the path
    os_exc = exc.to_oserror("ds/m/f")
    assert type(os_exc) is oserror
    assert (os_exc.errno, os_exc.strerror, os_exc.filename) == (num, "what happened", "ds/m/f")
    assert not isinstance(os_exc, e.ShoalError)
    assert type(exc.to_oserror()) is oserror and exc.to_oserror().filename is None
    assert e.errno_of(exc) == num and e.http_status_of(exc) == status
    assert exit_status(exc) == (2 if user else 1)
    # a class with no message of its own says what it is
    assert cls().message


def test_a_retryable_store_error_is_never_a_blocking_io_error() -> None:
    out = e.RetryableStoreError("GET k: SlowDown").to_oserror("k")
    assert type(out) is OSError and out.errno == errno.EIO
    assert not isinstance(out, BlockingIOError | TimeoutError | InterruptedError)


@pytest.mark.parametrize(
    ("num", "want", "kind"),
    [
        (errno.ENOTDIR, errno.ENOTDIR, NotADirectoryError),
        (errno.ENAMETOOLONG, errno.ENAMETOOLONG, OSError),
        (errno.EAGAIN, errno.EIO, OSError),
        (errno.EINTR, errno.EIO, OSError),
        (errno.ESRCH, errno.EIO, OSError),
    ],
)
def test_an_instance_errno_wins_unless_it_misleads(num: int, want: int, kind: type) -> None:
    exc = e.FatalStoreError("file:///d/x: not a directory")
    exc.errno = num  # as shoal.ufs.errors.translate keeps it
    assert exc.os_errno == want and e.errno_of(exc) == want
    out = exc.to_oserror()
    assert type(out) is kind and out.errno == want


def test_unknown_codes_and_foreign_exceptions() -> None:
    back = e.from_code("from_a_newer_peer", "m")
    assert type(back) is e.ShoalError and back.message == "m"
    assert e.errno_of(OSError(errno.ENOSYS, "x")) == errno.ENOSYS
    assert e.errno_of(FileNotFoundError("no errno")) == errno.ENOENT
    assert e.errno_of(PermissionError("no errno")) == errno.EACCES
    assert e.errno_of(TimeoutError()) == errno.EIO
    assert e.errno_of(KeyError("bug")) == errno.EIO
    assert e.http_status_of(KeyError("bug")) == 500


def test_codes_are_unique_and_subclasses_without_one_cross_as_their_parent() -> None:
    with pytest.raises(TypeError, match="is InvalidArgument's"):

        class Clash(e.ShoalError):  # pragma: no cover - refused at definition
            code = "invalid"

    class Late(e.Unavailable):
        """A worker did not answer in time."""

    assert "invalid" in e.CODES and e.CODES["invalid"] is e.InvalidArgument
    exc = Late()
    assert exc.code == "unavailable" and exc.errno == errno.EHOSTUNREACH
    assert type(e.from_code(exc.code, exc.message)) is e.Unavailable


# -- the front-ends use the table ---------------------------------------------------

AGREE = [
    e.InvalidArgument,
    e.DatasetNotFound,
    e.PathOutsideDataset,
    e.CredentialsError,
    e.NotFound,
    e.IsADirectory,
    e.RetryableStoreError,
    e.Unavailable,
    e.CorruptData,
    e.StaleVersion,
    e.StaleLayout,
]


@pytest.mark.parametrize("cls", AGREE, ids=[c.__name__ for c in AGREE])
def test_fuse_replies_with_the_tables_errno(cls: type[e.ShoalError]) -> None:
    from shoal.fuse import protocol as p
    from shoal.fuse.daemon import Daemon

    r, w = os.pipe()
    try:
        fs: Any = SimpleNamespace(handlers=dict, kernel_open=False)
        d = Daemon(w, fs, passthrough=False)
        d._fail(77, p.Op.READ, cls("x"))
        length, error, unique = p.OUT_HEADER.unpack(os.read(r, 4096))
    finally:
        os.close(r)
        os.close(w)
    assert (length, unique) == (p.OUT_HEADER.size, 77)
    assert -error == cls.errno == e.errno_of(cls("x"))
    assert d.errors == {cls.errno: 1}


class _Failing:
    """An AsyncClient stand-in whose every call raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def stat(self, path: str) -> Any:
        raise self.exc

    async def ls(self, path: str) -> Any:
        raise self.exc

    async def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        raise self.exc

    async def cat_many(self, paths: list[str]) -> dict[str, Any]:
        return dict.fromkeys(paths, self.exc)


@pytest.mark.parametrize("cls", AGREE, ids=[c.__name__ for c in AGREE])
def test_fsspec_raises_the_tables_oserror(cls: type[e.ShoalError]) -> None:
    from shoal.fsspec import ShoalFileSystem

    fs = ShoalFileSystem("http://127.0.0.1:9", skip_instance_cache=True)
    want = cls("x").to_oserror("ds/m/f")
    failing: Any = _Failing(cls("x"))
    fs.client = lambda: failing  # type: ignore[method-assign]
    calls = [lambda: fs.info("ds/m/f"), lambda: fs.cat_file("ds/m/f")]
    if want.errno == errno.ENOENT:  # a listing that fails otherwise asks stat next
        calls.append(lambda: fs.ls("ds/m/f"))
    for call in calls:
        with pytest.raises(OSError) as info:
            call()
        got = info.value
        assert type(got) is type(want) and got.errno == want.errno, call
        assert not isinstance(got, BlockingIOError)
        assert isinstance(got.__cause__, cls)
    out = fs.cat(["ds/m/f"], on_error="return")
    assert type(out["ds/m/f"]) is type(want) and out["ds/m/f"].errno == want.errno


@pytest.mark.parametrize(("cls", "code", "num", "status", "user", "oserror"), TABLE, ids=IDS)
def test_the_masters_answer_is_the_tables(
    cls: type[e.ShoalError], code: str, num: int, status: int, user: bool, oserror: type
) -> None:
    exc = cls("detail")
    assert control.http_status(exc) == status
    body = control.error_body(exc)
    assert body["error"]["code"] == code
    assert body["error"]["message"] == (
        "detail" if status < 500 else "internal error in the master; see its log"
    )
    with pytest.raises(cls) as info:
        control.raise_for_error(status, body)
    assert type(info.value) is cls

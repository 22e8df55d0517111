"""One exception tree for shoal, and the one table of what each error is outside it.

::

    class                       code             errno         HTTP  user's
    ShoalError                  io               EIO           500
    ├── UserError               user             EINVAL        400   yes
    │   ├── InvalidArgument     invalid          EINVAL        400   yes
    │   ├── DatasetNotFound     no_dataset       ENOENT        404   yes
    │   ├── DatasetExists       exists           EEXIST        409   yes
    │   ├── PathOutsideDataset  outside          ENOENT        404   yes
    │   └── CredentialsError    credentials      EACCES        403   yes
    ├── NotFound                not_found        ENOENT        404   yes    a FileNotFoundError
    ├── PermissionDenied        denied           EACCES        403   yes    a PermissionError
    │   └── Unauthenticated     unauthenticated  EACCES        401   yes    no valid token
    ├── IsADirectory            is_dir           EISDIR        404   yes    an IsADirectoryError
    ├── StoreError              store            EIO           502          under storage failed
    │   ├── RetryableStoreError store_retryable  EIO           503          timeouts, resets, 5xx
    │   │   └── StoreTimeout    store_timeout    ETIMEDOUT     504          no answer in its deadline
    │   └── FatalStoreError     store_fatal      EIO           502
    ├── Unavailable             unavailable      EHOSTUNREACH  503          a worker or the master
    ├── CorruptData             corrupt          EIO           500          checksum mismatch
    ├── ProtocolError           protocol         EPROTO        502          unknown wire format
    ├── StaleVersion            stale            ESTALE        409          the object changed
    └── StaleLayout             stale_layout     ESTALE        503          the page size changed

Columns, each a class attribute that subclasses override:

- ``code``: the machine-readable name on the wire (data path and HTTP error bodies) and
  in JSON output; :func:`from_code` rebuilds the class from it. Every class that sets
  one sets its own (checked at import); a subclass that does not (the CLI's
  OutputError, the client's TimedOut) crosses the wire as its parent.
- ``errno``: what a POSIX caller sees; :meth:`ShoalError.to_oserror` builds the
  builtin OSError from it and :func:`errno_of` gives the FUSE mount its reply. An
  instance may carry a more precise errno than its class (``shoal.ufs.errors`` keeps a
  store's ENOTDIR or ENAMETOOLONG on a FatalStoreError).
- ``http_status``: what an HTTP front-end (the master's API, the gateways) answers.
  5xx bodies never carry the message (see :mod:`shoal.proto.control`). IsADirectory
  is 404 because both gateway protocols say so (S3 has no directories; WebHDFS OPEN
  of a directory is a FileNotFoundException). StaleVersion is 409 (the caller may
  resubmit and read the new version); StaleLayout 503 (a worker has not yet caught up
  with the dataset's new page size: try again).
- ``user_fault`` (user's): the caller's doing (bad input, a name that is not there, no
  access). The CLI prints one line and exits 2 for these, 1 for the rest; the FUSE
  mount logs only the rest.

Decisions: a retryable store error reaches POSIX callers as a plain ``OSError(EIO)``.
``OSError(EAGAIN)`` would be a BlockingIOError, which tells a caller that its own
non-blocking call would block (it polls and spins); and TimeoutError would be wrong
for resets, 5xx and throttling (StoreTimeout, the one that is a timeout, is a
TimeoutError). By the time a front-end sees one, shoal's own retries
(``shoal.ufs.errors``) are spent, so EIO is the truth. For the same reason no error
ever becomes BlockingIOError, InterruptedError, ChildProcessError or
ProcessLookupError: an errno that would build one is reported as EIO.

There is no "is retryable" predicate: the read path decides per class (StaleVersion:
forget the metadata and ask again; CorruptData: ask again; Unavailable: the next
worker; StaleLayout: refresh the dataset), the store retries RetryableStoreError only,
and HTTP callers read the 503s above.

Backend errors are translated once, where they enter (``shoal.ufs``), into the most
specific class here; everything above that layer only ever sees this tree, and every
front-end maps it with this table and nothing else.
"""

from __future__ import annotations

import errno as _errno
from collections.abc import Mapping
from types import MappingProxyType

_BY_CODE: dict[str, type[ShoalError]] = {}
#: every wire code and the class it rebuilds (read-only view)
CODES: Mapping[str, type[ShoalError]] = MappingProxyType(_BY_CODE)

#: errnos whose builtin OSError subclass says something false about a failure
#: elsewhere (would block, interrupted by a signal, a child or process missing)
_MISLEADING = frozenset(
    {
        _errno.EAGAIN,
        _errno.EWOULDBLOCK,
        _errno.EALREADY,
        _errno.EINPROGRESS,
        _errno.EINTR,
        _errno.ECHILD,
        _errno.ESRCH,
    }
)


def _register(cls: type[ShoalError]) -> None:
    prev = _BY_CODE.get(cls.code)
    if prev is not None and (prev.__module__, prev.__qualname__) != (
        cls.__module__,
        cls.__qualname__,
    ):
        raise TypeError(f"{cls.__qualname__}: code {cls.code!r} is {prev.__qualname__}'s")
    _BY_CODE[cls.code] = cls


class ShoalError(Exception):
    """Base of every error shoal raises on purpose."""

    #: short machine-readable code used on the wire and in JSON output
    code: str = "io"
    errno: int = _errno.EIO
    http_status: int = 500
    user_fault: bool = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            _register(cls)

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.__class__.__doc__ or self.code)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.code

    @property
    def os_errno(self) -> int:
        """The errno a POSIX caller gets: this error's, or EIO where that would mislead."""
        code = self.errno
        if not isinstance(code, int) or code <= 0 or code in _MISLEADING:
            return _errno.EIO
        return code

    def to_oserror(self, path: str | None = None) -> OSError:
        """This error as the most specific builtin OSError for its errno
        (FileNotFoundError, PermissionError, IsADirectoryError, FileExistsError, ...,
        else a plain OSError), with ``path`` as its filename."""
        if path is None:
            return OSError(self.os_errno, self.message)
        return OSError(self.os_errno, self.message, path)


_register(ShoalError)


class UserError(ShoalError):
    """The request was malformed or refers to something that does not exist."""

    code = "user"
    errno = _errno.EINVAL
    http_status = 400
    user_fault = True


class InvalidArgument(UserError):
    """An argument or option is malformed."""

    code = "invalid"


class DatasetNotFound(UserError):
    """No dataset of that name."""

    code = "no_dataset"
    errno = _errno.ENOENT
    http_status = 404


class DatasetExists(UserError):
    """A dataset of that name already exists."""

    code = "exists"
    errno = _errno.EEXIST
    http_status = 409


class PathOutsideDataset(UserError):
    """The path does not name a dataset and mount."""

    code = "outside"
    errno = _errno.ENOENT  # no such mount: in a file system, no such file
    http_status = 404


class CredentialsError(UserError):
    """Credentials for under storage are missing or unusable."""

    code = "credentials"
    errno = _errno.EACCES
    http_status = 403


class NotFound(ShoalError, FileNotFoundError):
    """No such file or directory."""

    code = "not_found"
    errno = _errno.ENOENT
    http_status = 404
    user_fault = True


class PermissionDenied(ShoalError, PermissionError):
    """Access denied by under storage."""

    code = "denied"
    errno = _errno.EACCES
    http_status = 403
    user_fault = True


class Unauthenticated(PermissionDenied):
    """No credentials, or credentials this cluster did not issue (or that expired)."""

    code = "unauthenticated"
    http_status = 401


class IsADirectory(ShoalError, IsADirectoryError):
    """The path is a directory."""

    code = "is_dir"
    errno = _errno.EISDIR
    http_status = 404
    user_fault = True


class StoreError(ShoalError):
    """Under storage failed."""

    code = "store"
    http_status = 502


class RetryableStoreError(StoreError):
    """A transient under-storage failure (timeout, reset, 5xx, throttling)."""

    code = "store_retryable"
    http_status = 503


class StoreTimeout(RetryableStoreError):
    """Under storage did not answer (no connection, or no byte of an answer) within the
    deadline of its mount; the message names the store and the cause."""

    code = "store_timeout"
    errno = _errno.ETIMEDOUT
    http_status = 504


class FatalStoreError(StoreError):
    """An under-storage failure that retrying will not fix."""

    code = "store_fatal"


class Unavailable(ShoalError):
    """A worker or the master cannot be reached."""

    code = "unavailable"
    errno = _errno.EHOSTUNREACH
    http_status = 503


class CorruptData(ShoalError):
    """Cached bytes did not match their checksum."""

    code = "corrupt"


class ProtocolError(ShoalError):
    """A peer sent something this version does not understand."""

    code = "protocol"
    errno = _errno.EPROTO
    http_status = 502


class StaleVersion(ShoalError):
    """The object changed in under storage while it was being read."""

    code = "stale"
    errno = _errno.ESTALE
    http_status = 409


class StaleLayout(ShoalError):
    """The request was for another page layout (page size) than the worker serves: the
    dataset's policy changed. The client refreshes the dataset and retries."""

    code = "stale_layout"
    errno = _errno.ESTALE
    http_status = 503


def from_code(code: str, message: str) -> ShoalError:
    """Rebuild an error that crossed the wire as (code, message); an unknown code (a
    newer peer's) is a plain ShoalError."""
    return _BY_CODE.get(code, ShoalError)(message)


def errno_of(exc: BaseException) -> int:
    """The errno a POSIX front-end (the FUSE mount) answers ``exc`` with: the table's
    for a shoal error, an OSError's own, else EIO."""
    if isinstance(exc, ShoalError):
        return exc.os_errno
    if isinstance(exc, OSError):
        if exc.errno:
            return int(exc.errno)
        if isinstance(exc, FileNotFoundError):
            return _errno.ENOENT
        if isinstance(exc, PermissionError):
            return _errno.EACCES
    return _errno.EIO


def http_status_of(exc: BaseException) -> int:
    """The HTTP status an HTTP front-end answers ``exc`` with: the table's for a shoal
    error, 500 for anything else (a bug)."""
    return exc.http_status if isinstance(exc, ShoalError) else 500

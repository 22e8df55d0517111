"""One exception tree for shoal; every error knows its errno.

::

    ShoalError (EIO)
    ├── UserError (EINVAL)                 bad input: the CLI prints one line, exits 2
    │   ├── InvalidArgument (EINVAL)
    │   ├── DatasetNotFound (ENOENT)
    │   ├── DatasetExists (EEXIST)
    │   ├── PathOutsideDataset (EINVAL)
    │   └── CredentialsError (EACCES)      missing or unusable credentials
    ├── NotFound (ENOENT)                  also a FileNotFoundError
    ├── PermissionDenied (EACCES)          also a PermissionError
    ├── StoreError (EIO)                   under storage failed
    │   ├── RetryableStoreError (EAGAIN)   timeouts, resets, 5xx, throttling
    │   └── FatalStoreError (EIO)
    ├── Unavailable (EHOSTUNREACH)         a worker or the master cannot be reached
    ├── CorruptData (EIO)                  a checksum did not match
    └── ProtocolError (EPROTO)             a peer spoke a wire format we do not understand

Backend errors are translated once, where they enter (``shoal.ufs``), into the most
specific class here; everything above that layer only ever sees this tree.
"""

from __future__ import annotations

import errno as _errno


class ShoalError(Exception):
    """Base of every error shoal raises on purpose."""

    errno: int = _errno.EIO
    #: short machine-readable code used on the wire and in JSON output
    code: str = "io"

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.__class__.__doc__ or self.code)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.code


class UserError(ShoalError):
    """The request was malformed or refers to something that does not exist."""

    errno = _errno.EINVAL
    code = "invalid"


class InvalidArgument(UserError):
    """An argument or option is malformed."""


class DatasetNotFound(UserError):
    """No dataset of that name."""

    errno = _errno.ENOENT
    code = "no_dataset"


class DatasetExists(UserError):
    """A dataset of that name already exists."""

    errno = _errno.EEXIST
    code = "exists"


class PathOutsideDataset(UserError):
    """The path does not name a dataset and mount."""

    code = "outside"


class CredentialsError(UserError):
    """Credentials for under storage are missing or unusable."""

    errno = _errno.EACCES
    code = "credentials"


class NotFound(ShoalError, FileNotFoundError):
    """No such file or directory."""

    errno = _errno.ENOENT
    code = "not_found"


class PermissionDenied(ShoalError, PermissionError):
    """Access denied by under storage."""

    errno = _errno.EACCES
    code = "denied"


class StoreError(ShoalError):
    """Under storage failed."""

    code = "store"


class RetryableStoreError(StoreError):
    """A transient under-storage failure (timeout, reset, 5xx, throttling)."""

    errno = _errno.EAGAIN
    code = "store_retryable"


class FatalStoreError(StoreError):
    """An under-storage failure that retrying will not fix."""

    code = "store_fatal"


class Unavailable(ShoalError):
    """A worker or the master cannot be reached."""

    errno = _errno.EHOSTUNREACH
    code = "unavailable"


class CorruptData(ShoalError):
    """Cached bytes did not match their checksum."""

    code = "corrupt"


class ProtocolError(ShoalError):
    """A peer sent something this version does not understand."""

    errno = _errno.EPROTO
    code = "protocol"


_BY_CODE: dict[str, type[ShoalError]] = {}


def _collect(cls: type[ShoalError]) -> None:
    _BY_CODE.setdefault(cls.code, cls)
    for sub in cls.__subclasses__():
        _collect(sub)


_collect(ShoalError)


def from_code(code: str, message: str) -> ShoalError:
    """Rebuild an error that crossed the wire as (code, message)."""
    return _BY_CODE.get(code, ShoalError)(message)


def is_retryable(exc: BaseException) -> bool:
    """True for errors that another attempt (or another worker) may not repeat."""
    return isinstance(exc, RetryableStoreError | Unavailable | CorruptData)


class StaleVersion(ShoalError):
    """The object changed in under storage while it was being read."""

    errno = _errno.ESTALE
    code = "stale"


_collect(StaleVersion)


class IsADirectory(ShoalError, IsADirectoryError):
    """The path is a directory."""

    errno = _errno.EISDIR
    code = "is_dir"


_collect(IsADirectory)


class StaleLayout(ShoalError):
    """The request was for another page layout (page size) than the worker serves: the
    dataset's policy changed. The client refreshes the dataset and retries."""

    errno = _errno.ESTALE
    code = "stale_layout"


_collect(StaleLayout)

"""Incremental decoder of aws-chunked request bodies (``Content-Encoding: aws-chunked``).

An aws-chunked body frames the payload as ``hex-size[;chunk-signature=SIG]\\r\\n DATA
\\r\\n`` chunks, ends with a zero-size chunk and may carry trailing headers (checksums,
``x-amz-trailer-signature``) before a final empty line. It arrives inside whatever
HTTP framing the request used (Content-Length or Transfer-Encoding: chunked): the
gateway feeds the HTTP body's bytes here in any fragments and writes out what comes
back.

Which variant is read follows the payload the request declared (its
:class:`~shoal.gateway.sigv4.Verified`):

- ``STREAMING-AWS4-HMAC-SHA256-PAYLOAD``: every chunk is signed, each signature chained
  to the previous one from the request's seed signature; a chunk's bytes are released
  only after its signature checked out.
- ``STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER``: the same, then trailers signed by
  ``x-amz-trailer-signature``.
- ``STREAMING-UNSIGNED-PAYLOAD-TRAILER`` (botocore's default for uploads with a
  checksum) or no verified request: framing only, trailers allowed and unsigned.

Memory is bounded: one chunk (``max_chunk``, 16 MiB by default) for signed bodies,
nothing beyond the fragment fed for unsigned ones, and trailers of at most 16 KiB. A
checksum the caller names (``checksum="crc32"``, ``"sha1"`` or ``"sha256"``: the
value of ``x-amz-trailer`` or ``x-amz-sdk-checksum-algorithm``) is computed over the
decoded bytes and checked against its trailer, when the trailer is there.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import zlib
from typing import Protocol

from shoal.gateway.sigv4 import EMPTY_SHA256, AuthError, Verified

__all__ = ["MAX_CHUNK", "AwsChunkedDecoder"]

#: largest chunk accepted by default (clients use 8 KiB .. 1 MiB; 64 KiB is typical)
MAX_CHUNK = 16 * 1024 * 1024
_MAX_LINE = 4096
_MAX_TRAILERS = 16 * 1024
_SIGNED = {"STREAMING-AWS4-HMAC-SHA256-PAYLOAD", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"}
_TRAILER = {"STREAMING-UNSIGNED-PAYLOAD-TRAILER", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"}
_CHUNK_LINE = re.compile(rb"([0-9a-fA-F]{1,16})(?:;chunk-signature=([0-9a-f]{64}))?")
_TRAILER_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*?)[ \t]*")

# states
_HEADER, _DATA, _DATA_END, _TRAILERS, _MAYBE_END, _DONE = range(6)


class _Checksum(Protocol):
    def update(self, data: bytes, /) -> None: ...
    def digest(self) -> bytes: ...


class _Crc32:
    def __init__(self) -> None:
        self._crc = 0

    def update(self, data: bytes) -> None:
        self._crc = zlib.crc32(data, self._crc)

    def digest(self) -> bytes:
        return self._crc.to_bytes(4, "big")


def _checksum(name: str | None) -> tuple[str, _Checksum] | None:
    if name is None:
        return None
    algo = name.strip().lower().removeprefix("x-amz-checksum-")
    if algo == "crc32":
        return "x-amz-checksum-crc32", _Crc32()
    if algo in ("sha1", "sha256"):
        return f"x-amz-checksum-{algo}", hashlib.new(algo)
    return None  # crc32c, crc64nvme: not in the standard library; passed through


class AwsChunkedDecoder:
    """Feed body bytes in any fragments; get the decoded payload back; ``finish``
    returns the trailers (lower-case names, signature trailer removed).

    ``decoded_length`` (x-amz-decoded-content-length) is checked when given.
    Errors are :class:`~shoal.gateway.sigv4.AuthError`: SignatureDoesNotMatch (403) for a
    bad chunk or trailer signature, IncompleteBody for a truncated body, BadDigest for
    a checksum that does not match, InvalidRequest for anything malformed or too large.
    """

    def __init__(
        self,
        verified: Verified | None,
        *,
        decoded_length: int | None = None,
        checksum: str | None = None,
        max_chunk: int = MAX_CHUNK,
    ) -> None:
        payload = verified.payload if verified is not None else None
        self._signed = payload in _SIGNED
        self._trailers_allowed = payload in _TRAILER or payload not in _SIGNED
        self._trailer_signed = payload == "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
        if self._signed:
            assert verified is not None
            if not (verified.signing_key and verified.seed_signature and verified.scope):
                raise AuthError(
                    "InvalidRequest", "signed aws-chunked body needs a SigV4 signature", 400
                )
            self._key: bytes = verified.signing_key
            self._prefix = f"\n{verified.amz_date}\n{verified.scope}\n"
            self._prev: str = verified.seed_signature
        self._decoded_length = decoded_length
        self._max_chunk = max_chunk
        self._sum = _checksum(checksum)
        self._buf = bytearray()
        self._state = _HEADER
        self._left = 0  # bytes of the current chunk still to come
        self._chunk_sig: str | None = None
        self._chunk_hash = hashlib.sha256()
        self._held: list[bytes] = []
        self._total = 0
        self._trailers: dict[str, str] = {}
        self._trailer_lines: list[bytes] = []
        self._trailer_bytes = 0
        self._trailer_signature: str | None = None
        self._trailers_after_blank = False

    def feed(self, data: bytes) -> bytes:
        """Decoded payload bytes available so far (verified, for signed bodies)."""
        if self._state == _DONE and data:
            raise _malformed("data after the end of the aws-chunked body")
        self._buf += data
        out: list[bytes] = []
        while self._step(out):
            pass
        return b"".join(out)

    def finish(self) -> dict[str, str]:
        """The trailers; AuthError if the body ended early or its checks fail."""
        if self._state == _MAYBE_END:
            self._end()
        if self._state != _DONE or self._buf:
            raise AuthError("IncompleteBody", "the aws-chunked body ended early", 400)
        return dict(self._trailers)

    # --- the state machine -------------------------------------------------------

    def _step(self, out: list[bytes]) -> bool:
        """Make one transition if the buffer allows; False when it needs more data."""
        buf = self._buf
        state = self._state
        if state == _DATA:
            if not buf:
                return False
            n = min(self._left, len(buf))
            piece = bytes(buf[:n])
            del buf[:n]
            self._left -= n
            self._take(piece, out)
            if self._left == 0:
                self._state = _DATA_END
            return True
        if state == _DATA_END:
            if len(buf) < 2:
                return False
            if buf[:2] != b"\r\n":
                raise _malformed("a chunk is longer than its declared size")
            del buf[:2]
            self._end_chunk(out)
            self._state = _HEADER
            return True
        if state == _DONE:
            if buf:
                raise _malformed("data after the end of the aws-chunked body")
            return False
        line = self._line(_MAX_LINE if state == _HEADER else _MAX_TRAILERS)
        if line is None:
            return False
        if state == _HEADER:
            self._header(line, out)
        elif state == _MAYBE_END:
            # the AWS example puts an empty line between the last chunk and trailers
            self._state = _TRAILERS
            self._trailers_after_blank = True
            self._trailer(line)
        else:
            self._trailer(line)
        return True

    def _line(self, limit: int) -> bytes | None:
        end = self._buf.find(b"\r\n", 0, limit + 2)
        if end < 0:
            if len(self._buf) > limit:
                raise _malformed("an aws-chunked header line is too long")
            return None
        line = bytes(self._buf[:end])
        del self._buf[: end + 2]
        return line

    def _header(self, line: bytes, out: list[bytes]) -> None:
        m = _CHUNK_LINE.fullmatch(line)
        if m is None:
            raise _malformed("a malformed aws-chunked chunk header")
        size = int(m.group(1), 16)
        sig = m.group(2)
        if self._signed and sig is None:
            raise _malformed("an aws-chunked chunk lacks its chunk-signature")
        if not self._signed and sig is not None:
            raise _malformed("a chunk-signature in a body declared unsigned")
        if size > self._max_chunk:
            raise _malformed(f"an aws-chunked chunk is larger than {self._max_chunk} bytes")
        self._total += size
        if self._decoded_length is not None and self._total > self._decoded_length:
            raise _malformed("the body is longer than x-amz-decoded-content-length")
        self._chunk_sig = sig.decode() if sig is not None else None
        self._left = size
        if size:
            self._state = _DATA
            return
        self._end_chunk(out)  # the final chunk: its signature covers no bytes
        self._trailers_after_blank = False
        self._state = _TRAILERS

    def _take(self, piece: bytes, out: list[bytes]) -> None:
        if self._sum is not None:
            self._sum[1].update(piece)
        if self._signed:
            self._chunk_hash.update(piece)
            self._held.append(piece)
        else:
            out.append(piece)

    def _end_chunk(self, out: list[bytes]) -> None:
        if not self._signed:
            return
        sts = (
            "AWS4-HMAC-SHA256-PAYLOAD"
            + self._prefix
            + f"{self._prev}\n{EMPTY_SHA256}\n{self._chunk_hash.hexdigest()}"
        )
        expected = hmac.new(self._key, sts.encode(), hashlib.sha256).hexdigest()
        assert self._chunk_sig is not None
        if not hmac.compare_digest(expected, self._chunk_sig):
            raise AuthError("SignatureDoesNotMatch", "an aws-chunked chunk signature is wrong")
        self._prev = self._chunk_sig
        out.extend(self._held)
        self._held = []
        self._chunk_hash = hashlib.sha256()

    def _trailer(self, line: bytes) -> None:
        if not line:
            if self._trailer_bytes == 0 and not self._trailers_after_blank:
                self._state = _MAYBE_END if self._trailers_allowed else _DONE
                if self._state == _DONE:
                    self._end()
                return
            self._end()
            return
        if not self._trailers_allowed:
            raise _malformed("trailers in an aws-chunked body declared without them")
        self._trailer_bytes += len(line) + 2
        if self._trailer_bytes > _MAX_TRAILERS:
            raise _malformed("the aws-chunked trailers are too large")
        m = _TRAILER_LINE.fullmatch(line)
        if m is None:
            raise _malformed("a malformed aws-chunked trailer")
        name = m.group(1).decode().lower()
        value = m.group(2).decode("latin-1")
        if name == "x-amz-trailer-signature":
            if self._trailer_signature is not None:
                raise _malformed("more than one x-amz-trailer-signature")
            self._trailer_signature = value
            return
        if self._trailer_signature is not None:
            raise _malformed("a trailer after x-amz-trailer-signature")
        if name in self._trailers:
            raise _malformed(f"trailer {name!r} appears more than once")
        self._trailers[name] = value
        self._trailer_lines.append(name.encode() + b":" + m.group(2) + b"\n")

    def _end(self) -> None:
        self._state = _DONE
        if self._trailer_signed:
            self._check_trailer_signature()
        elif self._trailer_signature is not None:
            raise _malformed("x-amz-trailer-signature in a body declared without it")
        if self._decoded_length is not None and self._total != self._decoded_length:
            raise AuthError(
                "IncompleteBody", "the body is shorter than x-amz-decoded-content-length", 400
            )
        if self._sum is not None:
            name, running = self._sum
            sent = self._trailers.get(name)
            if sent is not None and sent != base64.b64encode(running.digest()).decode():
                raise AuthError("BadDigest", f"the {name} trailer does not match the body", 400)

    def _check_trailer_signature(self) -> None:
        sig = self._trailer_signature
        if sig is None:
            raise AuthError("SignatureDoesNotMatch", "the aws-chunked trailer is not signed")
        digest = hashlib.sha256(b"".join(self._trailer_lines)).hexdigest()
        sts = "AWS4-HMAC-SHA256-TRAILER" + self._prefix + f"{self._prev}\n{digest}"
        expected = hmac.new(self._key, sts.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected.encode(), sig.encode("latin-1")):
            raise AuthError("SignatureDoesNotMatch", "the aws-chunked trailer signature is wrong")


def _malformed(message: str) -> AuthError:
    return AuthError("InvalidRequest", message, 400)

"""ListObjects (v1 and v2) over a dataset: one page at a time from the manifest.

A bucket's keys are the dataset's key paths ('<mount>/<path>'), which the manifest
holds sorted. A page is found by bisection (prefix, start-after, marker, continuation
token) and walked forward for at most max-keys entries; a common prefix is skipped
over by bisecting to the first key after it, so a page of a 1M-key listing costs
O(page * log n) however deep the page is, and nothing but the page is built.

The sorted key list is taken from a manifest once per manifest version (a list of
references to the manifest's own strings) and kept while that manifest is current.

Without a manifest (no metadata load yet, or past its staleness bound) the listing
falls back to the workers' directory listings (``client.ls``): one directory with a
'/' delimiter, else a walk of the tree under the prefix, capped at
:data:`MAX_WALK` keys per request (beyond it: run ``shoal load --metadata-only``).

Continuation tokens are opaque (urlsafe base64 of '1:' + the first key the next
page may start at) and checked when they come back.
"""

from __future__ import annotations

import base64
import binascii
import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from shoal.core.manifest import Manifest
from shoal.core.types import FileInfo
from shoal.gateway.s3_xml import S3Error

__all__ = [
    "MAX_KEYS",
    "MAX_WALK",
    "IndexCache",
    "KeyIndex",
    "Page",
    "after",
    "decode_token",
    "encode_token",
]

MAX_KEYS = 1000
#: keys one listing without a manifest may walk
MAX_WALK = 100_000


@dataclass(frozen=True, slots=True)
class Row:
    size: int
    version: str
    mtime: float


class KeyIndex:
    """Sorted keys and, by position, what a listing shows of each."""

    def __init__(self, keys: list[str], row: Callable[[int], Row]) -> None:
        self.keys = keys
        self.row = row

    @classmethod
    def from_manifest(cls, man: Manifest) -> KeyIndex:
        entries = list(man.under(""))
        keys = [e.path for e in entries]

        def row(i: int) -> Row:
            e = entries[i]
            return Row(e.size, e.version, e.mtime)

        return cls(keys, row)

    @classmethod
    def from_infos(cls, infos: Sequence[tuple[str, FileInfo]]) -> KeyIndex:
        items = sorted(infos, key=lambda kv: kv[0])
        keys = [k for k, _ in items]

        def row(i: int) -> Row:
            f = items[i][1]
            return Row(f.size, f.version, f.mtime)

        return cls(keys, row)


@dataclass
class Page:
    contents: list[tuple[str, Row]] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    truncated: bool = False
    #: the first key the next page may start at (None when not truncated)
    resume: str | None = None
    #: the last key or common prefix on this page (ListObjects v1's NextMarker)
    last: str | None = None


def successor(s: str) -> str:
    """The smallest string greater than every string that starts with ``s``."""
    return s[:-1] + chr(ord(s[-1]) + 1)


def after(key: str, prefix: str, delimiter: str) -> str:
    """Where a listing that starts after ``key`` (start-after, marker) resumes: past
    ``key`` itself, or past its whole group when ``key`` is a common prefix."""
    if delimiter and key.startswith(prefix) and key.endswith(delimiter):
        j = key.find(delimiter, len(prefix))
        if j + len(delimiter) == len(key):
            return successor(key)
    return key + "\x00"  # keys hold no NUL: the first key above ``key``


def list_page(index: KeyIndex, prefix: str, delimiter: str, start: str, max_keys: int) -> Page:
    keys = index.keys
    page = Page()
    if max_keys <= 0:
        return page
    i = bisect.bisect_left(keys, max(start, prefix))
    n = len(keys)
    count = 0
    while i < n:
        k = keys[i]
        if not k.startswith(prefix):
            break
        if count == max_keys:
            page.truncated = True
            break
        if delimiter:
            j = k.find(delimiter, len(prefix))
            if j >= 0:
                cp = k[: j + len(delimiter)]
                page.prefixes.append(cp)
                page.last = cp
                page.resume = successor(cp)
                count += 1
                i = bisect.bisect_left(keys, page.resume, i)
                continue
        page.contents.append((k, index.row(i)))
        page.last = k
        page.resume = k + "\x00"
        count += 1
        i += 1
    if not page.truncated:
        page.resume = None
    return page


def encode_token(resume: str) -> str:
    return base64.urlsafe_b64encode(("1:" + resume).encode()).decode()


def decode_token(token: str) -> str:
    try:
        text = base64.urlsafe_b64decode(token.encode("ascii")).decode()
    except (binascii.Error, UnicodeError, ValueError):
        text = ""
    if not text.startswith("1:"):
        raise S3Error("InvalidArgument", "The continuation token provided is incorrect", 400)
    return text[2:]


class Lister(Protocol):
    async def ls(self, path: str) -> list[FileInfo]: ...


async def walk_index(client: Lister, dataset: str, prefix: str, delimiter: str) -> KeyIndex:
    """A KeyIndex of what a listing of ``prefix`` can show, from directory listings.
    Subdirectories become pseudo keys '<dir>/' (they group to the same common
    prefix with a '/' delimiter)."""
    base = f"/{dataset}/"
    top = prefix[: prefix.rfind("/")] if "/" in prefix else ""
    out: list[tuple[str, FileInfo]] = []
    todo = [top]
    recursive = delimiter != "/"
    while todo:
        d = todo.pop()
        try:
            children = await client.ls(base + d if d else base.rstrip("/"))
        except FileNotFoundError:
            continue
        for f in children:
            key = f.path[len(base) :] if f.path.startswith(base) else f.path.lstrip("/")
            if f.is_dir:
                if not (key + "/").startswith(prefix) and not prefix.startswith(key + "/"):
                    continue
                if recursive:
                    todo.append(key)
                else:
                    out.append((key + "/", f))
            elif key.startswith(prefix):
                out.append((key, f))
            if len(out) > MAX_WALK:
                raise S3Error(
                    "ServiceUnavailable",
                    f"listing more than {MAX_WALK} keys needs the dataset's manifest: "
                    "run `shoal load --metadata-only` on it",
                    503,
                )
    return KeyIndex.from_infos(out)


class IndexCache:
    """One KeyIndex per dataset, kept while the client's manifest object is the same."""

    def __init__(self) -> None:
        self._by_ds: dict[str, tuple[Manifest, KeyIndex]] = {}

    def get(self, ds: str, man: Manifest) -> KeyIndex:
        hit = self._by_ds.get(ds)
        if hit is None or hit[0] is not man:
            hit = self._by_ds[ds] = (man, KeyIndex.from_manifest(man))
        return hit[1]

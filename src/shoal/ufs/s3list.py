"""ListObjectsV2 on the lean path (:mod:`shoal.ufs.s3get`): the query, the parse of one
answer page, and a page loop that asks for the next page while the caller works
through the current one.

Why not s3fs here: a cold directory listing spent ~70% of the worker's CPU in
botocore's generic XML parser (a shape walk per element, a dateutil parse per
LastModified), ~10 ms per 100 keys on this machine kind; ElementTree and
``datetime.fromisoformat`` do the same work in a few percent of that. What a page
means is botocore's: keys come URL-encoded (``encoding-type=url``, as botocore asks
for them, so a key with characters XML 1.0 cannot carry still lists) and are decoded
only when the answer says they are, like botocore's ``decode_list_object_v2``.

Pages are asked for one after another (a continuation token exists only once the
previous page arrived); the overlap is the next request in flight while the caller
turns the current page into entries. Splitting one listing into key ranges
(StartAfter) is not done: without knowing how keys are spread, the ranges' listings
could not be bounded, and a range boundary inside a common prefix would report that
directory twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import quote, unquote_plus
from xml.etree import ElementTree

from shoal.errors import RetryableStoreError

#: one key of a page: (key, size, etag, last-modified as seconds since the epoch)
Entry = tuple[str, int, str, float]


@dataclass(slots=True)
class ListPage:
    contents: list[Entry] = field(default_factory=list)
    #: common prefixes, each ending in the delimiter
    prefixes: list[str] = field(default_factory=list)
    #: the continuation token of the next page; None on the last page
    next_token: str | None = None


def _q(value: str) -> str:
    return quote(value, safe="-_.~")


def list_query(prefix: str, delimiter: str | None, token: str | None, max_keys: int) -> str:
    """The encoded query string of one ListObjectsV2 request (pairs sorted, as signed)."""
    pairs = {"list-type": "2", "encoding-type": "url", "max-keys": str(max_keys), "prefix": prefix}
    if delimiter:
        pairs["delimiter"] = delimiter
    if token is not None:
        pairs["continuation-token"] = token
    return "&".join(f"{k}={_q(v)}" for k, v in sorted(pairs.items()))


def _mtime(text: str) -> float:
    try:
        return _dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        from botocore.utils import parse_timestamp  # the rare store with another format

        with contextlib.suppress(ValueError, TypeError):
            return float(parse_timestamp(text).timestamp())
        return 0.0


def parse_page(body: bytes) -> ListPage:
    """One ListBucketResult; RetryableStoreError for an answer that is not one (stores
    under throttling have sent truncated XML; botocore's parser failing is retried too)."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as exc:
        raise RetryableStoreError(f"unreadable listing page ({exc})") from None
    tag = root.tag
    ns = tag[: tag.index("}") + 1] if tag.startswith("{") else ""
    if tag[len(ns) :] != "ListBucketResult":
        raise RetryableStoreError(f"unexpected listing answer <{tag[len(ns) :]}>")
    decode = (root.findtext(f"{ns}EncodingType") or "") == "url"
    key_t, size_t, etag_t, lm_t = f"{ns}Key", f"{ns}Size", f"{ns}ETag", f"{ns}LastModified"
    page = ListPage()
    for c in root.iterfind(f"{ns}Contents"):
        key = c.findtext(key_t) or ""
        if decode:
            key = unquote_plus(key)
        lm = c.findtext(lm_t)
        page.contents.append(
            (key, int(c.findtext(size_t) or 0), c.findtext(etag_t) or "", _mtime(lm) if lm else 0.0)
        )
    for p in root.iterfind(f"{ns}CommonPrefixes/{ns}Prefix"):
        text = p.text or ""
        page.prefixes.append(unquote_plus(text) if decode else text)
    if (root.findtext(f"{ns}IsTruncated") or "").strip().lower() == "true":
        token = root.findtext(f"{ns}NextContinuationToken")
        if not token:
            raise RetryableStoreError("listing page is truncated but names no next page")
        page.next_token = token
    return page


async def pages(
    fetch: Callable[[str | None], Awaitable[ListPage]],
) -> AsyncGenerator[ListPage, None]:
    """Every page of one listing, in order: ``fetch(token)`` returns the page at
    ``token`` (None: the first), parsed, with its own retries. The next page is asked
    for before the current one is handed out; a failure of any page ends the listing
    with that failure (never a silently shorter listing)."""
    page = await fetch(None)
    ahead: asyncio.Future[ListPage] | None = None
    try:
        while True:
            if page.next_token is not None:
                ahead = asyncio.ensure_future(fetch(page.next_token))
                # let it send its request now: the caller's work on this page is
                # synchronous, and a task not yet started would overlap nothing
                await asyncio.sleep(0)
            yield page
            if ahead is None:
                return
            page = await ahead
            ahead = None
    finally:
        # the caller stopped early (or a page failed): no request left running
        if ahead is not None:
            ahead.cancel()
            if ahead.done() and not ahead.cancelled():
                ahead.exception()  # retrieved: not logged as never retrieved

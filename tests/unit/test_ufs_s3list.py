"""shoal.ufs.s3list without a store: the page loop hands out every page in order while
the next one is already asked for, stops cleanly, and fails on a failing page; the
parser reads namespaced and plain answers, decodes keys only when told they are
encoded, and refuses answers that are not a listing."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from shoal.errors import NotFound, RetryableStoreError
from shoal.ufs.s3list import ListPage, list_query, pages, parse_page

NS = "http://s3.amazonaws.com/doc/2006-03-01/"


def _xml(keys: list[str], prefixes: Sequence[str] = (), token: str | None = None, ns: str = NS,
         encoded: bool = True) -> bytes:  # fmt: skip
    xmlns = f' xmlns="{ns}"' if ns else ""
    parts = [f"<ListBucketResult{xmlns}><Name>b</Name>"]
    if encoded:
        parts.append("<EncodingType>url</EncodingType>")
    parts.append(f"<IsTruncated>{'true' if token else 'false'}</IsTruncated>")
    if token:
        parts.append(f"<NextContinuationToken>{token}</NextContinuationToken>")
    for i, k in enumerate(keys):
        parts.append(
            f"<Contents><Key>{k}</Key><LastModified>2026-12-01T10:00:0{i % 10}.250Z</LastModified>"
            f"<ETag>&quot;e{i}&quot;</ETag><Size>{i}</Size></Contents>"
        )
    for p in prefixes:
        parts.append(f"<CommonPrefixes><Prefix>{p}</Prefix></CommonPrefixes>")
    parts.append("</ListBucketResult>")
    return "".join(parts).encode()


def test_parse_reads_keys_sizes_etags_times_and_prefixes() -> None:
    page = parse_page(_xml(["d/a+b%26c", "d/%C3%BC"], ["d/sub%20x/"], token="t/1+="))
    assert page.contents == [
        ("d/a b&c", 0, '"e0"', 1796119200.25),
        ("d/ü", 1, '"e1"', 1796119201.25),
    ]
    assert page.prefixes == ["d/sub x/"] and page.next_token == "t/1+="
    plain = parse_page(_xml(["d/a+b"], ns="", encoded=False))
    assert plain.contents[0][0] == "d/a+b" and plain.next_token is None


@pytest.mark.parametrize(
    "body",
    [
        b"<ListBucketResult",
        b"<Error><Code>x</Code></Error>",
        _xml(["k"]).replace(b"false", b"true"),
    ],
)
def test_parse_refuses_what_is_not_a_whole_listing(body: bytes) -> None:
    with pytest.raises(RetryableStoreError):
        parse_page(body)


def test_query_is_sorted_and_encoded() -> None:
    q = list_query("a b/ü/", "/", "t/1+=", 1000)
    assert q == (
        "continuation-token=t%2F1%2B%3D&delimiter=%2F&encoding-type=url&list-type=2"
        "&max-keys=1000&prefix=a%20b%2F%C3%BC%2F"
    )
    assert "delimiter" not in list_query("", None, None, 7)


class Store:
    """Pages 0..n-1 behind tokens; records when each was asked for."""

    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at
        self.asked: list[int] = []
        self.running = 0
        self.gate: asyncio.Event | None = None

    async def fetch(self, token: str | None) -> ListPage:
        i = 0 if token is None else int(token)
        self.asked.append(i)
        self.running += 1
        try:
            if self.gate is not None and i > 0:
                await self.gate.wait()
            await asyncio.sleep(0)
            if i == self.fail_at:
                raise NotFound(f"page {i}")
            nxt = str(i + 1) if i + 1 < self.n else None
            return ListPage([(f"k{i:03d}-{j}", j, "e", 0.0) for j in range(3)], [], nxt)
        finally:
            self.running -= 1


async def test_every_page_in_order_with_the_next_one_asked_for_early() -> None:
    s = Store(40)
    seen: list[str] = []
    async for page in pages(s.fetch):
        i = len(seen) // 3
        # page i+1 was asked for before page i was handed out
        assert s.asked[-1] == min(i + 1, 39)
        seen += [e[0] for e in page.contents]
    assert seen == [f"k{i:03d}-{j}" for i in range(40) for j in range(3)]
    assert s.asked == list(range(40))


async def test_a_failing_page_fails_the_listing() -> None:
    s = Store(10, fail_at=6)
    got: list[ListPage] = []
    with pytest.raises(NotFound, match="page 6"):
        async for page in pages(s.fetch):
            got.append(page)
    assert len(got) == 6 and s.running == 0


async def test_stopping_early_cancels_the_page_in_flight() -> None:
    s = Store(10)
    s.gate = asyncio.Event()  # pages after the first hang in flight
    it = pages(s.fetch)
    first = await it.__anext__()
    assert first.next_token == "1"
    assert s.running == 1 and s.asked == [0, 1]
    await it.aclose()
    await asyncio.sleep(0)
    assert s.running == 0 and s.asked == [0, 1]

"""A TCP proxy that adds a fixed delay to every byte in each direction.

netem is not in this kernel, so latency is made here: each chunk read from one side is
written to the other ``delay`` seconds after it arrived, in order, without waiting for
earlier chunks' delays to add up. A request therefore costs one delay on the way in and
one on the way back (one RTT of 2 x delay), while bandwidth is not reduced (chunks in
flight overlap). Run as ``python -m shoal.bench.delayproxy --upstream HOST:PORT
--delay-ms N``; it prints ``http://127.0.0.1:PORT`` once listening, then ``control
HOST:PORT``, and runs until killed. It counts the bytes it carries each way: a
connection to the control address gets ``<to upstream> <from upstream>\n`` (what the
benchmark reports as bytes fetched from the store) and is closed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import sys
import time

CHUNK = 256 * 1024


#: bytes carried so far: [client -> upstream, upstream -> client]
_carried = [0, 0]


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, way: int
) -> None:
    queue: collections.deque[tuple[float, bytes]] = collections.deque()
    ready = asyncio.Event()
    done = False

    async def read_side() -> None:
        nonlocal done
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                _carried[way] += len(data)
                queue.append((time.monotonic() + delay, data))
                ready.set()
        finally:
            done = True
            ready.set()

    async def write_side() -> None:
        while True:
            while not queue:
                if done:
                    return
                ready.clear()
                await ready.wait()
            due, data = queue.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    rt = asyncio.ensure_future(read_side())
    try:
        await write_side()
    except (ConnectionError, OSError):
        pass
    finally:
        rt.cancel()
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()


async def _serve(listen: str, upstream: str, delay: float) -> None:
    uhost, uport = upstream.rsplit(":", 1)

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(uhost, int(uport))
        except OSError:
            cw.close()
            return
        try:
            await asyncio.gather(_pump(cr, uw, delay, 0), _pump(ur, cw, delay, 1))
        finally:
            for w in (cw, uw):
                with contextlib.suppress(Exception):
                    w.close()

    async def control(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            cw.write(f"{_carried[0]} {_carried[1]}\n".encode())
            await cw.drain()
        cw.close()

    host, port = listen.rsplit(":", 1)
    server = await asyncio.start_server(handle, host, int(port), backlog=1024)
    ctl = await asyncio.start_server(control, host, 0)
    bound, cbound = server.sockets[0].getsockname(), ctl.sockets[0].getsockname()
    print(f"http://{bound[0]}:{bound[1]}", flush=True)
    print(f"control {cbound[0]}:{cbound[1]}", flush=True)
    async with server, ctl:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m shoal.bench.delayproxy")
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--upstream", required=True)
    p.add_argument("--delay-ms", type=float, default=0.0)
    a = p.parse_args(argv)
    coro = _serve(a.listen, a.upstream, a.delay_ms / 1000.0)
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:  # pragma: no cover
        asyncio.run(coro)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()

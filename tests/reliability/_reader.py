"""A reader process for the reliability suite: reads paths over and over through
shoal.client.Client and checks every byte by digest against the source.

Usage: python _reader.py SPEC.json OUT.json SEED. SPEC holds the master URL, ``want``
(path -> digest, or path -> [allowed digests]; a path "p#offset#length" is a
ranged read), client settings, a stop file and
``rounds`` (0: until the stop file appears). OUT gets {reads, wrong, failed, errors,
max_read_s}; OUT with suffix .progress holds the running read count.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import xxhash

from shoal.client import Client
from shoal.config import ClientSettings


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    rng = random.Random(int(sys.argv[3]))
    progress = out.with_suffix(".progress")
    want: dict[str, str | list[str]] = spec["want"]
    stop = spec["stop"]
    rounds = int(spec["rounds"])
    paths = sorted(want)
    counts: dict[str, Any] = {"reads": 0, "wrong": 0, "failed": 0, "errors": [], "max_read_s": 0.0}
    client = Client(settings=ClientSettings(master=spec["master"], **spec["settings"]))
    done_rounds = 0
    try:
        while not os.path.exists(stop) and (rounds == 0 or done_rounds < rounds):
            rng.shuffle(paths)
            for p in paths:
                if os.path.exists(stop):
                    break
                t0 = time.monotonic()
                try:
                    if "#" in p:  # "path#offset#length": a ranged read
                        path, off, n = p.rsplit("#", 2)
                        data = client.read(path, int(off), int(n))
                    else:
                        data = client.read(p)
                except Exception as exc:  # counted: every failed read is a finding
                    counts["failed"] += 1
                    if len(counts["errors"]) < 5:
                        counts["errors"].append(f"{p}: {type(exc).__name__}: {exc}")
                else:
                    ok = want[p]
                    got = xxhash.xxh3_128_hexdigest(data)
                    if got != ok and not (isinstance(ok, list) and got in ok):
                        counts["wrong"] += 1
                        if len(counts["errors"]) < 5:
                            counts["errors"].append(f"{p}: wrong bytes ({len(data)} bytes)")
                counts["max_read_s"] = max(counts["max_read_s"], time.monotonic() - t0)
                counts["reads"] += 1
                if counts["reads"] % 10 == 0:
                    progress.write_text(str(counts["reads"]))
            done_rounds += 1
    finally:
        progress.write_text(str(counts["reads"]))
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(counts))
        os.replace(tmp, out)
        client.close_quietly()


if __name__ == "__main__":
    main()

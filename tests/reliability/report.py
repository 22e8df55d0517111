"""Turn the figures the reliability suite wrote (``SHOAL_RELIABILITY_OUT=DIR pytest
tests/reliability``) into the Markdown tables of RELIABILITY.md.

Usage: python tests/reliability/report.py DIR > table.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

_STANDARD = {"probe", "count", "holds", "failed"}


def _extra(row: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in row.items() if k not in _STANDARD and v != "")


def render(out: Path) -> str:
    runs = [json.loads(p.read_text()) for p in out.glob("*.json")]
    runs.sort(key=lambda r: (r.get("module", ""), r["test"]))
    held = [r for r in runs if r["outcome"] == "passed"]
    xfailed = [r for r in runs if r["outcome"] == "xfailed"]
    other = [r for r in runs if r["outcome"] not in ("passed", "xfailed")]
    lines = [
        "| area | probe | count | what must hold | failed | details |",
        "|---|---|---:|---|---:|---|",
    ]
    total = 0
    for r in held:
        area = r.get("module", "").removeprefix("test_").replace("_", " ")
        for row in r["rows"]:
            total += int(row["count"])
            lines.append(
                f"| {area} | {row['probe']} | {row['count']:,} | {row['holds']} "
                f"| {row['failed']} | {_extra(row)} |"
            )
    lines.append("")
    lines.append(f"{len(held)} tests passed, {total:,} probes counted in all.")
    if xfailed:
        lines += ["", "Known failures (strict xfails: each turns red once its item is fixed):", ""]
        lines += ["| test | why (the xfail's reason) | probe | count | what must hold | failed "]
        lines[-1] += "| details |"
        lines += ["|---|---|---|---:|---|---:|---|"]
        for r in xfailed:
            for row in r["rows"] or [{"probe": "", "count": 0, "holds": "", "failed": ""}]:
                lines.append(
                    f"| {r['test']} | {r.get('reason', '')} | {row['probe']} | {row['count']} "
                    f"| {row['holds']} | {row['failed']} | {_extra(row)} |"
                )
    if other:
        lines += ["", "Tests that did not pass:", ""]
        lines += [f"- {r['test']}: {r['outcome']}" for r in other]
    seconds = sum(float(r["seconds"]) for r in runs)
    lines += ["", f"Time in the tests' bodies: {seconds:.0f} s ({len(runs)} tests with figures)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    sys.stdout.write(render(Path(sys.argv[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

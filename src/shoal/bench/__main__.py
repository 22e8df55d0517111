"""``python -m shoal.bench [--quick] [--json] ...``: the same as ``shoal bench``."""

from __future__ import annotations

import sys

from shoal.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())

"""A Python environment on top of this one, for clients whose pins fight the project's.

Some clients users train with cannot be installed beside shoal's test set-up:
MosaicML streaming imports transformers at import time, whose pins want an older
huggingface_hub, tokenizers and numpy than the rest of the suite uses. An *overlay* is
a venv of its own whose site-packages come first and whose ``.pth`` then adds this
environment's: it holds only the packages named (installed without their
dependencies, at exact versions), and sees everything else from here. Nothing in this
environment changes.

Overlays are built once into ``~/.cache/shoal/overlays/<name>`` (``SHOAL_OVERLAY_CACHE``
moves it), keyed by their pins; :func:`overlay_python` returns the interpreter, or None
with the reason in :data:`LAST_ERROR` (no PyPI, no venv module), so tests can skip.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

#: why the last overlay_python() returned None
LAST_ERROR = ""


def cache_root() -> Path:
    env = os.environ.get("SHOAL_OVERLAY_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "shoal" / "overlays"


def overlay_python(name: str, pins: list[str], timeout: float = 600) -> Path | None:
    """The interpreter of overlay ``name`` holding exactly ``pins`` (``pkg==version``)."""
    global LAST_ERROR
    key = hashlib.sha256("\n".join(sorted(pins)).encode()).hexdigest()[:12]
    root = cache_root() / f"{name}-{key}"
    python = root / "bin" / "python"
    done = root / ".complete"
    if done.exists() and python.exists():
        return python
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                       capture_output=True, timeout=120)  # fmt: skip
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True, timeout=60,
        ).stdout.strip()  # fmt: skip
        # this environment's packages after the overlay's own
        Path(purelib, "zz-shoal-base.pth").write_text("\n".join(site.getsitepackages()) + "\n")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
             "--disable-pip-version-check", "--target", purelib, *pins],
            check=True, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        err = getattr(exc, "stderr", "") or str(exc)
        LAST_ERROR = f"overlay {name}: {str(err).strip().splitlines()[-1:] or exc}"
        shutil.rmtree(root, ignore_errors=True)
        return None
    done.touch()
    return python

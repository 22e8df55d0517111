"""A Python environment on top of this one, for clients whose pins fight the project's.

Some clients users train with cannot be installed beside shoal's test set-up:
MosaicML streaming imports transformers at import time, whose pins want an older
huggingface_hub, tokenizers and numpy than the rest of the suite uses. An *overlay* is
a venv of its own whose site-packages come first and whose ``.pth`` then adds this
environment's (as site directories, so their own ``.pth`` files run: an editable
install of shoal imports there too): it holds only the packages named (installed
without their dependencies, at exact versions), and sees everything else from here.
Nothing in this environment changes.

The same holds for torch itself: the suite's venv has the CPU build of torch, and
PyPI's torchvision imports only beside PyPI's (CUDA) build, so :data:`TORCHVISION`
pins that pair and the CUDA libraries it loads (they run on the CPU; ~4.4 GB, built
in about a minute from the wheels these machines keep on disk).

Overlays are built once into ``~/.cache/shoal/overlays/<name>`` (``SHOAL_OVERLAY_CACHE``
moves it), keyed by their pins and by this environment's site directories (which the
overlay's ``.pth`` names); :func:`overlay_python` returns the interpreter, or None
with the reason in :data:`LAST_ERROR` (no PyPI, no venv module), so tests can skip.
"""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

#: why the last overlay_python() returned None
LAST_ERROR = ""

#: bumped when the layout of an overlay changes, so old ones are rebuilt
_LAYOUT = "2"

#: torch and torchvision as a user gets them from PyPI, and what that torch loads at import
TORCHVISION = [
    "torch==2.14.1", "torchvision==0.29.1", "nvidia-cuda-runtime==13.0.96",
    "nvidia-cublas==13.1.1.3", "nvidia-cuda-cupti==13.0.85", "nvidia-cuda-nvrtc==13.0.88",
    "nvidia-cudnn-cu13==9.24.0.43", "nvidia-cufft==12.0.0.61", "nvidia-cufile==1.15.1.6",
    "nvidia-curand==10.4.0.35", "nvidia-cusolver==12.0.4.66", "nvidia-cusparse==12.6.3.3",
    "nvidia-cusparselt-cu13==0.8.1", "nvidia-nccl-cu13==2.30.7", "nvidia-nvjitlink==13.4.92",
    "nvidia-nvshmem-cu13==3.4.5", "nvidia-nvtx==13.0.85",
]  # fmt: skip


#: the overlay's .pth that adds this environment's site directories after its own
_BASE_PTH = "zz-shoal-base.pth"
_ADD = "import site; site.addsitedir({!r})"


def _base_pth(dirs: list[str]) -> str:
    return "".join(_ADD.format(d) + "\n" for d in dirs)


def _base_dirs(text: str) -> list[str]:
    """The directories a :func:`_base_pth` text adds."""
    head = _ADD.partition("{")[0]
    return [ast.literal_eval(line[len(head) : -1]) for line in text.splitlines()
            if line.startswith(head) and line.endswith(")")]  # fmt: skip


def cache_root() -> Path:
    env = os.environ.get("SHOAL_OVERLAY_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "shoal" / "overlays"


def overlay_root(name: str, pins: list[str]) -> Path:
    """Where overlay ``name`` over this environment lives.

    The overlay's ``.pth`` names this environment's site directories, so they are part
    of the key: a venv elsewhere (another clone) gets an overlay of its own.
    """
    parts = [_LAYOUT, *site.getsitepackages(), *sorted(pins)]
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
    return cache_root() / f"{name}-{key}"


def overlay_python(name: str, pins: list[str], timeout: float = 600) -> Path | None:
    """The interpreter of overlay ``name`` holding exactly ``pins`` (``pkg==version``)."""
    global LAST_ERROR
    base = site.getsitepackages()
    root = overlay_root(name, pins)
    python = root / "bin" / "python"
    done = root / ".complete"
    if done.exists() and python.exists():
        return python
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    prune_orphans(name)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                       capture_output=True, timeout=120)  # fmt: skip
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True, timeout=60,
        ).stdout.strip()  # fmt: skip
        # this environment's packages after the overlay's own, with their .pth files
        Path(purelib, _BASE_PTH).write_text(_base_pth(base))
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


def prune_orphans(name: str) -> list[Path]:
    """Remove overlays ``name`` built over environments that no longer exist.

    Each is gigabytes (torch), and each clean clone with its own venv builds its own, so
    the overlays of deleted clones are dropped when a new one is built. Returns them.
    """
    gone = []
    for root in cache_root().glob(f"{name}-*"):
        pths = list(root.glob(f"lib/python*/site-packages/{_BASE_PTH}"))
        dirs = [d for pth in pths for d in _base_dirs(pth.read_text())]
        if pths and dirs and all(Path(d).is_dir() for d in dirs):
            continue
        shutil.rmtree(root, ignore_errors=True)
        gone.append(root)
    return gone

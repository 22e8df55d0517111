"""A process that will receive handed-over descriptors grows its descriptor table
once, early (``wire.make_room_for_fds``): grown on demand by the kernel in a process
with threads, each growth waited for an RCU grace period inside ``recvmsg``."""

from __future__ import annotations

import subprocess
import sys

PROBE = r"""
import os, threading
from shoal.proto import wire

def fdsize():
    for line in open("/proc/self/status"):
        if line.startswith("FDSize:"):
            return int(line.split()[1])

before = fdsize()
wire.make_room_for_fds()
after = fdsize()
wire.make_room_for_fds()  # once per process: nothing more
again = fdsize()
pid = os.fork()
if pid == 0:  # a forked child's table is as large as what it inherited: grown again
    small = fdsize() < wire.FD_TABLE
    wire.make_room_for_fds()
    os._exit(0 if small and fdsize() >= wire.FD_TABLE else 1)
_, status = os.waitpid(pid, 0)
print(before, after, again, os.waitstatus_to_exitcode(status))
"""


def _run(code: str) -> str:
    """What a fresh interpreter running ``code`` prints."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout


def test_the_table_grows_once() -> None:
    before, after, again, child = map(int, _run(PROBE).split())
    assert before < 1024 <= after and again == after
    assert child == 0


def test_a_descriptor_in_use_is_left_alone() -> None:
    """The table is grown by asking for a free number at or above the top, never by
    taking one: a process's own descriptor there is not closed or replaced."""
    code = (
        "import os\n"
        "from shoal.proto import wire\n"
        "fd = os.open('/proc/self/status', os.O_RDONLY)\n"
        "os.dup2(fd, wire.FD_TABLE - 1)\n"
        "wire.make_room_for_fds()\n"
        "print(os.readlink(f'/proc/self/fd/{wire.FD_TABLE - 1}'))\n"
    )
    assert _run(code).strip().endswith("/status")


def test_a_low_descriptor_limit_is_respected() -> None:
    code = (
        "import resource, os\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
        "from shoal.proto import wire\n"
        "wire.make_room_for_fds()\n"
        "print(open(os.devnull).fileno() > 0)\n"
    )
    assert _run(code).strip() == "True"

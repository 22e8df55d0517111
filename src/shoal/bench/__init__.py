"""``shoal bench``: shoal side by side with the tools users would pick instead, and
with the physical limit, on one machine.

The pieces: ``netshape`` (a network namespace with a tbf-shaped veth pair and a
userspace delay proxy, so the "remote" store has a bandwidth cap and per-request
latency), ``stores`` (moto or a one-node Ceph RGW inside that namespace, and the
benchmark data), ``contenders`` (a registry: each way of reading the same files),
``runner`` (epochs in reader processes, wall time and CPU time), ``suite`` (which
workloads run, quick or full) and ``report`` (BENCHMARKS.md, charts, JSON). The math
is in ``stats`` and has unit tests; nothing else here is timed in tests.
"""

"""The master: coordinator of a shoal cluster, off the data path.

It owns datasets (mounts and cache policy), worker membership and the hash ring clients
route by, and cluster reports; its state lives in SQLite under ``state_dir`` and
survives restarts. Layout:

- :mod:`shoal.master.state` -- the SQLite file;
- :mod:`shoal.master.validate` -- request bodies to typed values;
- :mod:`shoal.master.service` -- operations, driving :mod:`shoal.core.membership`;
- :mod:`shoal.master.report`, :mod:`shoal.master.metrics` -- reports and /metrics;
- :mod:`shoal.master.server` -- the HTTP API, :func:`start_master`, :func:`run_master`.
"""

from shoal.master.server import MasterServer, run_master, start_master

__all__ = ["MasterServer", "run_master", "start_master"]

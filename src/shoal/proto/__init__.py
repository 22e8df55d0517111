"""Typed messages between client, worker and master, versioned.

``wire``: the lean length-prefixed binary data path (client <-> worker): frames,
limits, argument checks and the protocol version. ``messages``: one typed request and
reply per data-path op, encoded and decoded there and nowhere else. ``control``: the
HTTP JSON control plane (master); ``master_api``: its one client.
"""

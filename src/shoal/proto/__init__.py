"""Typed messages between client, worker and master, versioned.

``wire``: the lean length-prefixed binary data path (client <-> worker).
``control``: the HTTP JSON control plane (master).
"""

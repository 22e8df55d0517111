"""Prometheus metrics of one gateway, in its own registry, served at ``/metrics`` on
the gateway's port.

=====================================  =========  ==========================
name                                   type       labels
=====================================  =========  ==========================
shoal_gateway_requests_total           counter    gateway, op, status
shoal_gateway_bytes_total              counter    gateway, op (body bytes out
                                                  for reads, in for writes)
shoal_gateway_request_seconds          histogram  gateway, op
=====================================  =========  ==========================

``op`` is the protocol's operation name (S3: GetObject, ListObjectsV2, ...; WebHDFS:
OPEN, LISTSTATUS, ...), never a path, so the label set stays small.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["GatewayMetrics"]

#: seconds: small GETs sit at the bottom, whole large objects at the top
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class GatewayMetrics:
    """The metrics of gateway ``gateway`` ("s3", "webhdfs")."""

    def __init__(self, gateway: str) -> None:
        self.gateway = gateway
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "shoal_gateway_requests_total",
            "Gateway requests by operation and HTTP status",
            ["gateway", "op", "status"],
            registry=self.registry,
        )
        self._bytes = Counter(
            "shoal_gateway_bytes_total",
            "Body bytes a gateway sent (reads) or received (writes)",
            ["gateway", "op"],
            registry=self.registry,
        )
        self._seconds = Histogram(
            "shoal_gateway_request_seconds",
            "Gateway request latency (until the whole body was handed to the socket)",
            ["gateway", "op"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self._children: dict[tuple[str, int], tuple[Counter, Histogram]] = {}
        self._bytes_of: dict[str, Counter] = {}

    def observe(self, op: str, status: int, nbytes: int, seconds: float) -> None:
        # the labelled children, kept: ``labels()`` takes a lock and builds a key on
        # every call, a cost per request that a warm GET notices (op and status are few)
        kids = self._children.get((op, status))
        if kids is None:
            kids = self._children[(op, status)] = (
                self._requests.labels(self.gateway, op, str(status)),
                self._seconds.labels(self.gateway, op),
            )
        kids[0].inc()
        if nbytes:
            out = self._bytes_of.get(op)
            if out is None:  # made on the first bytes: no zero series for HEADs
                out = self._bytes_of[op] = self._bytes.labels(self.gateway, op)
            out.inc(nbytes)
        kids[1].observe(seconds)

    def text(self) -> bytes:
        return generate_latest(self.registry)

    async def handler(self, request: web.Request) -> web.Response:
        """``GET /metrics``: the Prometheus text format."""
        resp = web.Response(body=self.text())
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

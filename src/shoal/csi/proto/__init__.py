"""The CSI spec's messages and services (csi.v1), generated from ``csi.proto`` by
grpcio-tools; regenerate with ``python -m shoal.csi.proto.regen``."""

"""The CSI node plugin: publishes a dataset's directory of the node's shoal FUSE mount
into a pod's volume (bind mount, read-only) over the CSI gRPC interface."""

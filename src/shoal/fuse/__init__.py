"""POSIX mount over the client: the kernel's FUSE protocol spoken directly (protocol),
/dev/fuse and mount(2) (kernel), the file system (ops), the request loop (daemon) and
the mount's life cycle (service)."""

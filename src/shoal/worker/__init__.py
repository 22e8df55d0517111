"""The worker process: page store, read-through loader, data-path server, heartbeats."""

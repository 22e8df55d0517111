"""The ``shoal`` command: one module per command group."""

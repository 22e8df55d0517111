"""Public test helpers: a local cluster on free ports, a moto S3 server, fault injection."""

"""The Kubernetes operator (kopf): Dataset, Runtime and DataLoad resources reconciled
into the master's API, node labels that follow the cache, and the mutating admission
webhook for data-aware scheduling. Built on the client and the master API only."""

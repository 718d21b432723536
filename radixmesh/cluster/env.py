"""The environment variables the `radixmesh` command reads: secrets stay out of `ps`, and
the launchers set them for the processes they start."""

from __future__ import annotations

API_KEY_ENV = "RADIXMESH_API_KEY"  # comma-separated keys, when no --api-key is given
# The key the router sends to its workers (environment only: kept out of `ps`).
WORKER_API_KEY_ENV = "RADIXMESH_WORKER_API_KEY"
HEALTH_ADDRESS_ENV = "RADIXMESH_HEALTH_ADDRESS"  # the images set it (their HEALTHCHECK)
# The router's admin keys (FlushCache, ClusterStatus, aborting any request), comma-separated.
ADMIN_KEY_ENV = "RADIXMESH_ADMIN_KEY"
# The local launcher's process id, given to each worker and router it starts (parent.py).
PARENT_PID_ENV = "RADIXMESH_PARENT_PID"

"""The cluster backend (`RuntimeEndpoint`, `Runtime`): not available in this build.

It talks to the router over the gRPC client SDK (the gRPC server/client issue) and
`Runtime` launches a local cluster (the router issue). Until both land these raise
instead of pretending: use `radixmesh.Engine` in-process meanwhile.
"""

from __future__ import annotations

from typing import Any

from radixmesh.lang.errors import BackendUnavailable

_WHY = (
    "needs the gRPC client SDK and the router (the gRPC and router issues), which are not "
    "in this build yet; use the in-process backend: "
    "radixmesh.set_default_backend(radixmesh.Engine('smollm2'))"
)


def RuntimeEndpoint(base_url: str, **options: Any) -> Any:
    raise BackendUnavailable(f"RuntimeEndpoint({base_url!r}) {_WHY}")


def Runtime(**options: Any) -> Any:
    raise BackendUnavailable(f"Runtime(...) {_WHY}")

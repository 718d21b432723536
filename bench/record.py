"""A benchmark's record: what ran, where, with which versions, and what it measured.

Every benchmark writes one JSON object of the same shape:

    {"benchmark": NAME, "date": ISO 8601, "machine": {...}, "versions": {...},
     "command": {the parsed command line}, ...the benchmark's own figures}

to `--out`, or else to `bench/results/<benchmark>[-<name>]-<machine>.json`: one current
file per benchmark, configuration and machine (`cpu`, `h200`, `h200x2`); git keeps the
history of each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
HEADER = ("benchmark", "date", "machine", "versions", "command")
# Packages whose version a record names when the benchmark has imported them.
_PACKAGES = ("torch", "triton", "transformers", "xgrammar", "grpc", "aiohttp", "numpy", "ray")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def machine() -> dict[str, Any]:
    """Host, CPU model and cores; torch's threads and the GPUs. A process that has not
    loaded torch (the router simulator, the serving load generator) asks nvidia-smi."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info: dict[str, Any] = {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count()}
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
        return info
    gpus = _nvidia_smi()
    if gpus:
        info["gpus"] = gpus
    return info


def _nvidia_smi() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def machine_tag(info: dict[str, Any] | None = None) -> str:
    """`cpu`, or the GPU's model and count: `h200`, `h200x2`."""
    info = machine() if info is None else info
    if "gpu" in info:
        name, count = info["gpu"], info.get("gpu_count", 1)
    elif info.get("gpus"):
        name, count = info["gpus"][0].split(",")[0], len(info["gpus"])
    else:
        return "cpu"
    model = name.split()[-1].lower()
    return model if count == 1 else f"{model}x{count}"


def versions() -> dict[str, str]:
    """Python, radixmesh, and every package of `_PACKAGES` the process has imported."""
    import radixmesh

    out = {"python": platform.python_version(), "radixmesh": radixmesh.__version__}
    for name in _PACKAGES:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            out[name] = str(module.__version__)
    return out


def add_output_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", default=None, help="the JSON's path (default: bench/results/...)")
    ap.add_argument(
        "--name",
        default=None,
        help="a configuration's name in the default path: <benchmark>-<name>-<machine>.json",
    )


def default_path(benchmark: str, name: str | None, tag: str) -> Path:
    return RESULTS / f"{benchmark}{f'-{name}' if name else ''}-{tag}.json"


def header(benchmark: str, args: argparse.Namespace, date: str | None = None) -> dict[str, Any]:
    """The keys every record starts with (`HEADER`)."""
    return {
        "benchmark": benchmark,
        "date": date or now(),
        "machine": machine(),
        "versions": versions(),
        "command": {k: v for k, v in vars(args).items() if k != "out"},
    }


def write(
    benchmark: str,
    args: argparse.Namespace,
    figures: dict[str, Any],
    *,
    date: str | None = None,
    name: str | None = None,
) -> Path:
    """Write the record of one run: to `args.out`, or to the default path, named by
    `args.name` (else `name`) and this machine. Returns the path."""
    clash = set(HEADER) & figures.keys()
    if clash:
        raise ValueError(f"figures: {sorted(clash)} are the record's own keys")
    record = {**header(benchmark, args, date), **figures}
    out = getattr(args, "out", None)
    name = getattr(args, "name", None) or name
    path = Path(out) if out else default_path(benchmark, name, machine_tag(record["machine"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(f"wrote {path}")
    return path

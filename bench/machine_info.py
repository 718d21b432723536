"""The machine a benchmark ran on, for its results JSON (one definition for every bench)."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any


def machine() -> dict[str, Any]:
    """Host, CPU model and cores; torch's thread count and the GPU when torch is loaded
    (the router simulator runs without it)."""
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
    return info

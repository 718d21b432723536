"""The benchmarks' one record shape, their default paths, and that every benchmark
imports as a module of the `bench` package (run as `python -m bench.<name>`)."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

import pytest

from bench import host_overhead, record

BENCH = Path(record.__file__).parent
# Importable names only: a scratch file (".probe.py") is not a benchmark.
MODULES = sorted(
    p.stem for p in BENCH.glob("*.py") if p.stem.isidentifier() and p.stem != "__init__"
)


def test_machine_tag_names_the_gpu_and_its_count() -> None:
    assert record.machine_tag({"host": "h", "cores": 2}) == "cpu"
    assert record.machine_tag({"gpu": "NVIDIA H200", "gpu_count": 1}) == "h200"
    assert record.machine_tag({"gpu": "NVIDIA H200", "gpu_count": 2}) == "h200x2"
    smi = ["NVIDIA H200, 143771 MiB, 580.159", "NVIDIA H200, 143771 MiB, 580.159"]
    assert record.machine_tag({"gpus": smi}) == "h200x2"


def test_default_path_is_one_file_per_benchmark_configuration_and_machine() -> None:
    assert record.default_path("offline", None, "h200") == record.RESULTS / "offline-h200.json"
    assert record.default_path("tp", "smoke", "cpu") == record.RESULTS / "tp-smoke-cpu.json"


def test_figures_may_not_overwrite_the_header(tmp_path: Path) -> None:
    args = argparse.Namespace(out=str(tmp_path / "x.json"), name=None)
    with pytest.raises(ValueError, match=r"figures: \['machine'\]"):
        record.write("x", args, {"machine": "mine"})
    assert not (tmp_path / "x.json").exists()


def test_a_benchmark_writes_the_record_shape(tmp_path: Path) -> None:
    out = tmp_path / "host.json"
    argv = ["--requests", "4", "--prompt-len", "8", "--new-tokens", "4", "--repeats", "1"]
    host_overhead.main([*argv, "--out", str(out)])
    saved = json.loads(out.read_text())
    assert list(saved)[:5] == list(record.HEADER)
    assert saved["benchmark"] == "host_overhead"
    assert saved["command"]["requests"] == 4 and "out" not in saved["command"]
    assert saved["versions"]["radixmesh"] and saved["versions"]["torch"]
    assert saved["machine"]["cores"] >= 1
    assert saved["results"]["num_steps"] >= 4


@pytest.mark.parametrize("name", MODULES)
def test_every_benchmark_imports_as_a_package_module(name: str) -> None:
    module = importlib.import_module(f"bench.{name}")
    assert module.__name__ == f"bench.{name}"
    if name not in ("record",):
        assert callable(getattr(module, "main", None)), f"bench/{name}.py has no main()"
    assert "sys.path" not in (BENCH / f"{name}.py").read_text()

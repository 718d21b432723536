"""The v1 contract: stubs in radixmesh/v1 match `make proto`, and `buf lint` is clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTOS = sorted((ROOT / "proto" / "radixmesh" / "v1").glob("*.proto"))


def test_stubs_are_fresh(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'proto'}"]
    cmd += [f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}"]
    subprocess.run(cmd + [str(p) for p in PROTOS], check=True)
    fresh = sorted(p.name for p in (tmp_path / "radixmesh" / "v1").iterdir())
    kept = sorted(p.name for p in (ROOT / "radixmesh" / "v1").glob("*_pb2*.py*"))
    assert kept == fresh
    for name in fresh:
        new = (tmp_path / "radixmesh" / "v1" / name).read_text()
        old = (ROOT / "radixmesh" / "v1" / name).read_text()
        assert old == new, f"radixmesh/v1/{name} is stale: run `make proto`"


def test_buf_lint() -> None:
    buf = shutil.which("buf") or str(Path(sys.executable).parent / "buf")
    assert Path(buf).exists(), "buf (PyPI buf-bin, a dev dependency) is not installed"
    result = subprocess.run([buf, "lint"], cwd=ROOT / "proto", capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_stubs_import_and_name_the_services() -> None:
    from radixmesh.v1 import router_pb2, worker_pb2

    worker = worker_pb2.DESCRIPTOR.services_by_name["Worker"]
    router = router_pb2.DESCRIPTOR.services_by_name["Router"]
    assert worker.full_name == "radixmesh.v1.Worker"
    assert [m.name for m in worker.methods] == [
        "Generate", "Score", "Abort", "GetLoad", "StreamCacheEvents", "GetCacheSnapshot",
        "FlushCache", "GetModelInfo", "Embed", "StreamOutputs", "PutStoredResponse",
        "GetStoredResponse", "DeleteStoredResponse",
    ]  # fmt: skip
    assert [m.name for m in router.methods] == [
        "Generate", "Select", "Resume", "Abort", "ClusterStatus", "FlushCache", "GetModelInfo",
        "Embed",
    ]  # fmt: skip

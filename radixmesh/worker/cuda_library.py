"""The project's CUDA C++ kernels (`*/kernels/cuda/*.cu`): built by nvcc into the
project's cache at first use, or ahead of time, and loaded through ctypes.

A library is compiled once per source, flags and GPU architecture into
`RADIXMESH_CUDA_CACHE` (default `cuda/` in RADIXMESH_CACHE_DIR, ~/.cache/radixmesh, where
converted GGUF files go too), named by a hash of the source, the shared headers in
`INCLUDE_DIR` (worker/cuda/: device helpers the kernels have in common) and the flags, so
an edit never loads a stale build and a second start loads it in milliseconds. A library already
there (the CUDA image builds them per GPU architecture it targets) is loaded without
nvcc. The sources have no Python or torch headers in them: nvcc alone builds each in a
few seconds, and each entry point takes a parameter block of raw pointers and strides and
the caller's CUDA stream (so a CUDA graph records its launches like any other).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from radixmesh.model_source import cache_root

log = logging.getLogger(__name__)

_FLAGS = ("-O3", "-shared", "-Xcompiler", "-fPIC", "-std=c++17")
INCLUDE_DIR = Path(__file__).parent / "cuda"  # headers every kernel may include


def nvcc() -> str | None:
    """The nvcc to build with: on PATH, else under CUDA_HOME or /usr/local/cuda."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None


def cache_dir() -> Path:
    """RADIXMESH_CUDA_CACHE, else `cuda/` in the project's cache (RADIXMESH_CACHE_DIR)."""
    explicit = os.environ.get("RADIXMESH_CUDA_CACHE")
    return Path(explicit) if explicit else cache_root() / "cuda"


def _flags(capability: tuple[int, int]) -> list[str]:
    arch = f"{capability[0]}{capability[1]}"
    return [*_FLAGS, f"-gencode=arch=compute_{arch},code=sm_{arch}"]


def library_path(source: Path, capability: tuple[int, int], out_dir: Path) -> Path:
    """Where `source`'s library for sm_<capability> is (or will be) in `out_dir`."""
    h = hashlib.sha256(source.read_bytes())
    for header in sorted(INCLUDE_DIR.glob("*.cuh")):
        h.update(header.read_bytes())
    h.update(" ".join(_flags(capability)).encode())
    return out_dir / f"{source.stem}-{h.hexdigest()[:16]}-sm{capability[0]}{capability[1]}.so"


def build(source: Path, capability: tuple[int, int], compiler: str, out_dir: Path) -> Path:
    """Compile `source` for sm_<capability> into `out_dir` (kept if already there; no GPU
    needed, so an image can build it for its GPUs ahead of time). Raises on failure."""
    target = library_path(source, capability, out_dir)
    if target.is_file():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    # Another process may build the same library at once: each writes its own file and
    # renames it into place (atomic), so a reader never sees a partial one.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        run = subprocess.run(
            [compiler, *_flags(capability), f"-I{INCLUDE_DIR}", "-o", tmp, str(source)],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            raise RuntimeError(f"nvcc failed ({run.returncode}): {run.stderr[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load(source: Path, device_index: int, what: str) -> ctypes.CDLL | None:
    """`source`'s library for this GPU (built here if not there yet), or None with the
    reason logged (`what` names the kernel): a GPU before sm_89 (no e4m3 conversion
    instruction), no nvcc, a failed build or load."""
    capability = torch.cuda.get_device_capability(device_index)
    if capability < (8, 9):
        log.info("%s: the CUDA kernel needs sm_89+ (this GPU: sm_%d%d)", what, *capability)
        return None
    path = library_path(source, capability, cache_dir())
    if not path.is_file():  # not built ahead of time (an image's build): build it here
        compiler = nvcc()
        if compiler is None:
            log.warning("%s: no nvcc found, so the Triton kernels run instead", what)
            return None
        try:
            path = build(source, capability, compiler, cache_dir())
        except (OSError, RuntimeError) as e:
            log.warning("%s: the CUDA kernel did not build (%s); Triton kernels instead", what, e)
            return None
    try:
        return ctypes.CDLL(str(path))
    except OSError as e:
        log.warning("%s: the CUDA kernel did not load (%s); Triton kernels instead", what, e)
        return None


def build_ahead(source: Path, argv: list[str] | None, description: str | None) -> None:
    """A kernel module's `python -m ... 8.9 9.0 10.0`: build `source`'s library for these
    GPU architectures into the cache ahead of time (the CUDA image does, so its workers
    start without compiling), printing each library's path."""
    import argparse

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("archs", nargs="+", help="compute capabilities, e.g. 9.0")
    args = ap.parse_args(argv)
    compiler = nvcc()
    if compiler is None:
        raise SystemExit("no nvcc found (PATH, CUDA_HOME, /usr/local/cuda)")
    for arch in args.archs:
        major, minor = (int(v) for v in arch.split("."))
        print(build(source, (major, minor), compiler, cache_dir()))

"""`pip install radixmesh` is the client SDK and the frontend language, without the engine's
packages: installed in a clean virtualenv, a language program runs against a cluster.

The cluster (router and workers) runs from the project's own environment; the clean one
holds the base package and its dependencies only (`pyproject.toml`'s `dependencies`;
the engine's are the `worker` extra).
"""

from __future__ import annotations

import subprocess
import tomllib
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
# Distributions the base install must not have; all but triton (torch's, on CUDA) are the
# worker extra's own.
ENGINE_ONLY = ("torch", "triton", "xgrammar", "outlines-core", "gguf", "aiohttp", "msgpack")

PROGRAM = """
import sys
import radixmesh as sgl

@sgl.function
def answer(s, question):
    s += "Q: " + question + "\\nA:"
    s += sgl.gen("a", max_tokens=8, temperature=0)
    s += " So: " + sgl.select("yes_no", choices=["yes", "no"])

sgl.set_default_backend(sgl.RuntimeEndpoint(sys.argv[1]))
states = answer.run_batch([{"question": "Is water wet?"}, {"question": "Is fire cold?"}])
for st in states:
    assert st["yes_no"] in ("yes", "no") and isinstance(st["a"], str), st
heavy = sorted(m for m in ("torch", "triton", "xgrammar", "aiohttp", "msgpack") if m in sys.modules)
print("ok", len(states), heavy)
"""


def _names(requirements: list[str]) -> set[str]:
    out = set()
    for r in requirements:
        name = r.split(";")[0]
        for sep in "<>=!~[ ":
            name = name.split(sep)[0]
        out.add(name.strip().lower())
    return out


def test_the_engines_packages_are_the_worker_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = _names(project["dependencies"])
    worker = _names(project["optional-dependencies"]["worker"])
    assert not base & set(ENGINE_ONLY), base & set(ENGINE_ONLY)
    assert set(ENGINE_ONLY) - {"triton"} <= worker


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    config = LaunchSpec(model="dummy:tiny", workers=1, port=free_port(), ready_timeout=240.0)
    with LocalCluster(config) as c:
        yield c


@pytest.fixture(scope="module")
def clean_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with the base package installed (from the package registry)."""
    env = tmp_path_factory.mktemp("base-venv")
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(ROOT)],
        check=True,
        timeout=600,
    )
    return python


def test_base_install_has_no_engine_packages(clean_python: Path) -> None:
    code = (
        "import importlib.util as u\n"
        f"print(sorted(m for m in {[m.replace('-', '_') for m in ENGINE_ONLY]!r} "
        "if u.find_spec(m)))"
    )
    out = subprocess.run(
        [str(clean_python), "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_a_program_runs_from_the_base_install(
    clean_python: Path, cluster: LocalCluster, tmp_path: Path
) -> None:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    out = subprocess.run(
        [str(clean_python), str(script), cluster.address],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # not the repository: the installed package, not the source tree
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "ok 2 []"

"""The compile processes never run the user's script, and one that cannot start is the
server's error (INTERNAL), never the constraint's.

Each case is a real script run as `python script.py` (so its `__main__` is a file that
multiprocessing would re-run in every child), with an in-process `Engine` on dummy:tiny
(byte tokenizer) created at module level, without a `__name__ == "__main__"` guard.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]

# One script, for both cases (an engine start is most of a case's time). First, out of
# file descriptors when the first compile starts its processes: a real cause (a server at
# its descriptor limit), and deterministic: the limit is set to exactly the descriptors
# open, so the compile pool's first pipe fails. Then, the limit back, the same constraint
# compiles in processes that must not re-run this script (it has no main guard).
_SCRIPT = """
import json, os, resource, sys
from radixmesh.worker.engine import Engine

print("script ran", file=sys.stderr, flush=True)  # counted by the test: once
engine = Engine("dummy:tiny", grammar_compile_processes=2)
engine.worker.grammars.build.result(timeout=60)  # the backend is built; no process yet
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")), hard))
params = {"max_new_tokens": 4, "temperature": 0, "regex": "[0-9]{4}"}
try:
    engine.generate("abc", params)
    first = None
except Exception as e:
    first = [type(e).__name__, getattr(e, "grpc_status", None), str(e)]
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
again = engine.generate("abc", params)["text"]  # not the cached failure: compiled now
print(json.dumps({"first": first, "again": again}))
engine.shutdown()
"""


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """(the script's JSON line, its stderr)"""
    folder = tmp_path_factory.mktemp("script")
    path = folder / "script.py"
    path.write_text(_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(path)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_compile_processes_that_cannot_start_are_an_internal_error(
    script: tuple[dict[str, Any], str],
) -> None:
    kind, status, message = script[0]["first"]
    assert (kind, status) == ("Internal", None)  # raised here: INTERNAL over gRPC, HTTP 500
    assert message.startswith("the grammar compile processes could not start or stopped: ")
    assert "Too many open files" in message
    assert "regex" not in message  # not blamed on the constraint


def test_a_script_without_a_main_guard_compiles_in_processes_that_do_not_rerun_it(
    script: tuple[dict[str, Any], str],
) -> None:
    out, stderr = script
    assert len(out["again"]) == 4 and out["again"].isdigit()
    assert stderr.count("script ran") == 1  # no compile process ran the script
    assert "bootstrapping" not in stderr

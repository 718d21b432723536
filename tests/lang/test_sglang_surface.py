"""radixmesh's frontend against the real sglang package's: the same public names, the
same arguments in the same order with the same defaults, the same state and fork-group
methods, global_config fields and dtype patterns (the JSON of tests/lang/sglang_surface.py,
one subprocess per package)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SGLANG_SITE = Path(os.environ.get("RADIXMESH_SGLANG_SITE", ROOT / ".sglang-site"))


def surface(package: str) -> dict[str, Any]:
    path = [str(ROOT)] + ([str(SGLANG_SITE)] if package == "sglang" else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.lang.sglang_surface", package],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = re.sub(r" object at 0x[0-9a-f]+", " object", proc.stdout)  # default objects' ids
    return dict(json.loads(text.strip().splitlines()[-1]))


def test_the_frontend_api_is_sglangs() -> None:
    if not (SGLANG_SITE / "sglang").is_dir():
        pytest.fail(f"the sglang frontend is not installed in {SGLANG_SITE} (`make setup`)")
    theirs, ours = surface("sglang"), surface("radixmesh")
    assert set(theirs["names"]) <= set(ours["names"])  # every public name of sglang
    rename = {"sglang.lang": "radixmesh.lang"}
    for kind in ("functions", "methods"):
        for name, params in theirs[kind].items():
            expected = json.loads(_renamed(json.dumps(params), rename))
            assert ours[kind][name] == expected, (kind, name)
    assert ours["endpoint"] == theirs["endpoint"]  # base_url, api_key, verify, chat_template_name
    for key in ("state", "group", "global_config", "regex"):
        assert ours[key] == theirs[key], key


def _renamed(text: str, rename: dict[str, str]) -> str:
    for a, b in rename.items():
        text = text.replace(a, b)
    return text

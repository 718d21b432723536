"""`import radixmesh` stays cheap: the language loads, its heavy backends do not."""

from __future__ import annotations

import subprocess
import sys


def test_import_loads_no_heavy_module() -> None:
    code = (
        "import sys, radixmesh as sgl\n"
        "assert sgl.gen and sgl.function and sgl.select and sgl.set_default_backend\n"
        "print(sorted(m for m in ('torch', 'transformers', 'openai', 'anthropic') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

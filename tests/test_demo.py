"""`make demo`'s program (examples/demo.py) on the bundled model, run as `make demo` runs
it: it finishes, and what it says about placement is what the router did: each part's
per-worker counts name every worker and add up to the part's requests, the batch (one
program) stays on one worker as its words say, and the cache report covers them all."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_the_demo_says_what_it_does(smollm2_gguf: object) -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    workers = re.search(r"cluster ready .*, workers (.*)\n", out)
    assert workers is not None
    names = re.findall(r"(worker-\d+) 127\.0\.0\.1:\d+", workers.group(1))
    assert len(names) == 2
    placements = re.findall(r"requests per worker: (.*)", out)
    assert len(placements) == 3  # chat, batch, fork
    totals = []
    for line in placements:
        counts = dict(re.findall(r"(worker-\d+) (\d+)", line))
        assert sorted(counts) == sorted(names)  # every worker named, idle ones too
        totals.append(sum(int(n) for n in counts.values()))
    assert totals == [3, 8, 3]  # three chat turns, eight questions, three branches
    batch = dict(re.findall(r"(worker-\d+) (\d+)", placements[1]))
    assert sorted(int(n) for n in batch.values()) == [0, 8]  # one program, one worker
    assert "a program's requests stay on the worker holding its prefix" in placements[1]
    overall = re.search(r"overall\s+\d+ /\s+\d+ =\s+\d+%\s+\((\d+) requests\)", out)
    assert overall is not None and int(overall.group(1)) == 14

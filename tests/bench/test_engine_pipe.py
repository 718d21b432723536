"""bench/engine_pipe.py: one repeat of every workload and size, its record's rows (the
benchmark itself checks that both encodings give back what was sent)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import engine_pipe


def test_the_engine_pipe_benchmark_records_every_workload_and_size(tmp_path: Path) -> None:
    out = tmp_path / "pipe.json"
    engine_pipe.main(["--repeats", "1", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["benchmark"] == "engine_pipe"
    rows = saved["rows"]
    assert [(r["workload"], r["n"]) for r in rows] == [
        (w, n) for w in engine_pipe.WORKLOADS for n in engine_pipe.SIZES
    ]
    for r in rows:  # sizes are deterministic: msgpack's rows are smaller than pickle's
        assert 0 < r["bytes_msgpack"] < r["bytes_pickle"]
        assert r["encode_us_msgpack"] > 0 and r["pipe_us_pickle"] > 0

"""bench.speculative without a GPU: a smoke run of each part on dummy:tiny, whose record
holds each part's figures."""

from __future__ import annotations

import json
from pathlib import Path

from bench import speculative
from bench.sets.copy_heavy import TASKS


def test_the_set_has_each_kind() -> None:
    assert sorted({t.kind for t in TASKS}) == ["edit", "extract", "json", "rewrite"]
    assert len(TASKS) == 12


def test_smoke_run_records_every_part(tmp_path: Path) -> None:
    out = tmp_path / "spec.json"
    speculative.main(
        [
            "--model", "dummy:tiny", "--parts", "copy,verify,draft,batch,eagle", "--drafters",
            "ngram", "--eagle-history", "8",
            "--draft-model", "dummy:tiny",
            "--max-new-tokens", "6", "--verify-ks", "2", "--verify-prompt", "16",
            "--verify-tokens", "4", "--repeats", "1", "--batch", "4", "--batch-prompt", "8",
            "--batch-new-tokens", "4", "--out", str(out),
        ]
    )  # fmt: skip
    record = json.loads(out.read_text())
    assert record["benchmark"] == "speculative"
    copy = record["copy"]
    assert sorted(copy) == ["ngram", "off"]
    # Equality with plain decoding is the engine tests' (tests/worker/speculative/).
    assert copy["ngram"]["tasks"] == 12 and copy["off"]["speedup"] == 1.0
    assert all(len(c["per_task"]) == 12 for c in copy.values())
    assert sorted(record["verify"]) == ["0", "2"] and record["verify"]["0"]["ratio"] == 1.0
    assert sorted(record["batch"]["tok_per_s"]) == ["ngram", "off"]
    draft = record["draft"]
    assert (draft["draft_model"], draft["k"]) == ("dummy:tiny", 4)
    assert draft["plain"]["verify_steps"] == 0 and draft["draft"]["verify_steps"] > 0
    assert draft["ratio"] > 0 and draft["step_vs_plain"] > 0
    eagle = record["eagle"]
    assert (eagle["k"], eagle["history"]) == (4, 8)
    assert [r["requests"] for r in eagle["rows"]] == [1, 4, 16]
    assert all(r["batched_ms"] > 0 and r["one_by_one_ms"] > 0 for r in eagle["rows"])

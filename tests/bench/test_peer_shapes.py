"""bench.peer_shapes without a GPU: its shapes, its published figures, and a smoke run on
dummy:tiny whose record holds every shape's exact token count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import peer_shapes


def test_shapes_parse_and_every_default_shape_has_a_published_figure_and_a_count() -> None:
    shapes = peer_shapes.parse_shapes(peer_shapes.DEFAULT_SHAPES)
    assert shapes[:3] == [(128, 128), (1000, 1000), (2048, 2048)]
    for shape in shapes:
        assert peer_shapes.PUBLISHED[shape] > 0 and peer_shapes.REQUESTS[shape] > 0


@pytest.mark.parametrize("bad", ["128", "128/x", "a/128", "128/128,"])
def test_a_malformed_shape_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ValueError, match="--shapes"):
        peer_shapes.parse_shapes(bad)


def test_smoke_run_records_each_config_and_shape(tmp_path: Path) -> None:
    out = tmp_path / "peer.json"
    peer_shapes.main(["--smoke", "--configs", "bf16,fp8-kv", "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["benchmark"] == "peer_shapes"
    for name in ("bf16", "fp8-kv"):
        rows = record["configs"][name]
        assert sorted(rows) == ["16/8", "32/4"]
        assert all(r["requests"] == 4 and r["output_tok_per_s"] > 0 for r in rows.values())
        assert all(r["published_tok_per_s"] is None for r in rows.values())


def test_an_unknown_config_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="--configs: unknown 'fp4'"):
        peer_shapes.main(["--smoke", "--configs", "fp4"])


def test_overlap_runs_each_config_once_per_setting_under_its_own_key(tmp_path: Path) -> None:
    out = tmp_path / "peer.json"
    peer_shapes.main(["--smoke", "--configs", "bf16", "--overlap", "on,off", "--out", str(out)])
    configs = json.loads(out.read_text())["configs"]
    assert sorted(configs) == ["bf16/overlap-off", "bf16/overlap-on"]
    for rows in configs.values():
        assert all(r["output_tokens"] == 4 * int(s.split("/")[1]) for s, r in rows.items())
    with pytest.raises(ValueError, match="--overlap: 'sometimes'"):
        peer_shapes.main(["--smoke", "--overlap", "sometimes"])

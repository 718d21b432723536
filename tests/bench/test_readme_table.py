"""The README's results table is generated from bench/results/ (bench/readme_table.py)."""

from __future__ import annotations

from bench.readme_table import README, readme_table, table


def test_the_readme_shows_the_recorded_results() -> None:
    assert readme_table(README.read_text()) == table(), (
        "the README's results table differs from bench/results/: "
        "run `python -m bench.readme_table --write`"
    )

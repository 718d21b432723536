from __future__ import annotations

import subprocess
import sys

import pytest

from radixmesh.cluster.cli import build_parser, engine_options
from radixmesh.errors import InvalidArgument
from radixmesh.worker.config import EngineConfig


def test_every_engine_option_is_a_flag() -> None:
    args = build_parser().parse_args(
        [
            "generate",
            "hi",
            "--model",
            "dummy:tiny",
            "--page-size",
            "4",
            "--policy",
            "fcfs",
            "--disable-radix-cache",
            "--kv-cache-tokens",
            "256",
            "--new-token-ratio",
            "0.5",
        ]
    )
    opts = engine_options(args)
    cfg = EngineConfig.from_options(**opts)
    assert cfg.model.model == "dummy:tiny"
    assert cfg.cache.page_size == 4 and cfg.cache.disable_radix_cache
    assert cfg.cache.kv_cache_tokens == 256
    assert cfg.scheduler.policy == "fcfs" and cfg.scheduler.new_token_ratio == 0.5


def test_unknown_engine_option_names_itself() -> None:
    with pytest.raises(InvalidArgument) as err:
        EngineConfig.from_options(model="dummy:tiny", page_sise=4)
    assert err.value.field == "page_sise"


def test_bad_option_value_names_the_field() -> None:
    with pytest.raises(InvalidArgument) as err:
        EngineConfig.from_options(policy="random")
    assert err.value.field == "policy"


@pytest.mark.slow
def test_generate_command_answers_paris() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "radixmesh.cluster.cli",
            "generate",
            "--model",
            "smollm2",
            "What is the capital of France? Answer in one word.",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout


def test_generate_command_reports_bad_input_cleanly() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "radixmesh.cluster.cli",
            "generate",
            "--model",
            "dummy:tiny",
            "--temperature",
            "-1",
            "hello",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert "temperature: must be >= 0" in proc.stderr

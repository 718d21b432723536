"""`radixmesh launch --model org/name` from a hub cache the test writes, network off: the
served model name on /v1/models, the chat template file applied by the router (which
tokenizes), the weight-loading progress and the periodic stats line in the logs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from radixmesh.cluster.launch import free_port
from tests.cluster.processes import ready_line
from tests.hub_cache import REPO, snapshot_dir, write_tiny_llama

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_launch_serves_a_hub_model_offline(tmp_path: Path) -> None:
    from openai import OpenAI
    from transformers import AutoTokenizer

    cache = tmp_path / "hub"
    write_tiny_llama(cache)
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}")
    port, http_port = free_port(), free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}",  # nothing listens: no network
    }
    log = (tmp_path / "launch.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixmesh.cluster.cli", "launch", "--model", REPO,
         "--download-dir", str(cache), "--served-model-name", "tiny",
         "--chat-template", str(template), "--workers", "1", "--port", str(port),
         "--http-port", str(http_port), "--dtype", "float32",
         "--worker-args", "--log-stats-interval 0.2"],
        stdout=subprocess.PIPE, stderr=log, text=True, env=env,
    )  # fmt: skip
    try:
        ready_line(proc, "radixmesh cluster ready")
        client = OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused")
        assert [m.id for m in client.models.list()] == ["tiny"]
        messages: list[Any] = [{"role": "user", "content": "hello there"}]
        resp = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=4, temperature=0
        )
        assert resp.model == "tiny"
        tok = AutoTokenizer.from_pretrained(snapshot_dir(cache))
        assert resp.usage is not None
        assert resp.usage.prompt_tokens == len(tok.encode("<<hello there>>"))
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    logs = (tmp_path / "launch.log").read_text()
    assert "loading weights" in logs
    assert "stats: running 0, waiting 0, generation" in logs
    assert "prefix cache hit rate" in logs

"""Hub ids (`org/name[@revision]`) from a hub cache the tests write, with the network off:
the cache is read without a network call, a missing model is a clear error naming the
model and the cache, an unreachable hub too (`HF_ENDPOINT` points at a closed loopback
port), and the engine serves the snapshot with the same greedy tokens as transformers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from radixmesh import hub, model_source
from radixmesh.cluster.launch import free_port
from radixmesh.errors import InvalidArgument
from tests.hub_cache import CHAT_TEMPLATE, COMMIT, REPO, write_tiny_llama

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    write_tiny_llama(root)
    write_tiny_llama(root, "test-org/tokenizer-only", weights=False)
    return root


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    cmd = [sys.executable, "-m", "radixmesh.cluster.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=120)


def test_a_cached_model_resolves_offline(cache: Path) -> None:
    snap = cache / "models--test-org--tiny-llama" / "snapshots" / COMMIT
    expected = model_source.ModelSource("hf", path=str(snap), hub_name=f"{REPO}@{COMMIT}")
    for spec, revision in ((REPO, None), (f"{REPO}@main", None), (REPO, COMMIT)):
        src = model_source.resolve_model(spec, revision=revision, download_dir=str(cache))
        assert src == expected
    with pytest.raises(InvalidArgument) as e:
        model_source.resolve_model(f"{REPO}@v1", revision="v2", download_dir=str(cache))
    assert e.value.field == "revision"


def test_parse_hub_id() -> None:
    assert hub.parse_hub_id("org/name") == hub.HubModel("org/name")
    assert hub.parse_hub_id("org/name@v1.2", None) == hub.HubModel("org/name", "v1.2")
    assert hub.parse_hub_id("org/name", "dev") == hub.HubModel("org/name", "dev")
    for spec in ("smollm2", "/abs/path", "./rel/dir", "a/b/c", "dummy:tiny"):
        assert hub.parse_hub_id(spec) is None, spec


def test_a_missing_model_names_itself_and_the_cache(cache: Path) -> None:
    with pytest.raises(InvalidArgument) as e:
        model_source.resolve_model("test-org/absent", download_dir=str(cache))
    assert e.value.field == "model"
    assert "test-org/absent" in str(e.value) and str(cache) in str(e.value)
    assert "HF_HUB_OFFLINE=1" in str(e.value)


def test_a_tokenizer_only_snapshot_serves_a_router_not_a_worker(cache: Path) -> None:
    src = model_source.resolve_model(
        "test-org/tokenizer-only", download_dir=str(cache), weights=False
    )
    assert src.kind == "hf" and Path(src.path or "").joinpath("tokenizer.json").is_file()
    with pytest.raises(InvalidArgument, match="its model files are not in the Hugging Face"):
        model_source.resolve_model("test-org/tokenizer-only", download_dir=str(cache))


def test_download_command_reads_the_cache_and_fails_clearly_offline(cache: Path) -> None:
    out = _cli("download", REPO, "--download-dir", str(cache))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(cache / "models--test-org--tiny-llama" / "snapshots" / COMMIT)
    # Not cached, downloads allowed, the hub unreachable (a closed loopback port).
    out = _cli(
        "download",
        "test-org/absent",
        "--download-dir",
        str(cache),
        HF_HUB_OFFLINE="0",
        HF_ENDPOINT=f"http://127.0.0.1:{free_port()}",
    )
    assert out.returncode == 2
    assert out.stderr.startswith(
        f"radixmesh: error: model: test-org/absent is not in the Hugging Face cache {cache} "
        "and the hub cannot be reached to download it"
    ), out.stderr


def test_engine_serves_the_hub_model_like_transformers(cache: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from radixmesh.worker.engine import Engine

    snap = cache / "models--test-org--tiny-llama" / "snapshots" / COMMIT
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    engine = Engine(REPO, download_dir=str(cache), dtype="float32", chat_template=str(template))
    try:
        messages = [{"role": "user", "content": "The capital of France"}]
        assert engine.tokenizer.apply_chat_template(messages) == "[The capital of France]"
        assert engine.worker.tokenizer_spec == f"{REPO}@{COMMIT}"
        prompt = "The capital of France is"
        out = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True})
        assert isinstance(out, dict)
    finally:
        engine.shutdown()
    ref = LlamaForCausalLM.from_pretrained(snap, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(snap)
    assert tok.chat_template == CHAT_TEMPLATE
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        gen = ref.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert out["output_ids"] == gen[0, ids.shape[1] :].tolist()


def test_a_bad_chat_template_is_refused(cache: Path, tmp_path: Path) -> None:
    from radixmesh.worker.engine import Engine

    with pytest.raises(InvalidArgument, match=r"chat_template: .*missing\.jinja is not a file"):
        Engine(REPO, download_dir=str(cache), chat_template=str(tmp_path / "missing.jinja"))
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}no end")
    with pytest.raises(InvalidArgument) as e:
        Engine(REPO, download_dir=str(cache), dtype="float32", chat_template=str(broken))
    assert e.value.field == "chat_template" and str(broken) in str(e.value)

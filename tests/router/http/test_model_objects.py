"""The served model as each client reads it: `/v1/models` through OpenAI's and Anthropic's
clients, `/get_model_info` through a plain HTTP client and through SGLang's own frontend.

The router's HTTP front end with a model and no worker (tests/router/http/openai/
frontend.py): these routes answer from the model info alone. The model info is the
bundled smollm2's (its spec, its ChatML template's markers), under the served name
`smollm2`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
import requests

from radixmesh.router.http.model_identity import is_sglang_frontend
from radixmesh.tokenizer import ByteTokenizer
from tests.router.http.openai.frontend import Frontend

ROOT = Path(__file__).resolve().parents[3]
SGLANG_SITE = Path(os.environ.get("RADIXMESH_SGLANG_SITE", ROOT / ".sglang-site"))
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


@pytest.fixture(scope="module")
def frontend() -> Iterator[Frontend]:
    f = Frontend(ByteTokenizer(256, eos_token_ids=[0]), "smollm2", context_length=2048)
    f.info.tokenizer = "smollm2"
    f.info.chat_template = CHATML
    yield f
    f.close()


# ---- /v1/models --------------------------------------------------------------------------------


def test_openai_client_gets_openai_model_objects(frontend: Frontend) -> None:
    with openai.OpenAI(base_url=frontend.url + "/v1", api_key="unused", max_retries=0) as client:
        (listed,) = client.models.list().data
        one = client.models.retrieve("smollm2")
        with pytest.raises(openai.NotFoundError) as missing:
            client.models.retrieve("gpt-4o")
    expected = {
        "id": "smollm2",
        "object": "model",
        "created": frontend.frontend.started,
        "owned_by": "radixmesh",
        "root": HUB_ID,
        "max_model_len": 2048,
    }
    assert listed.model_dump(exclude_none=True) == expected
    assert one.model_dump(exclude_none=True) == expected
    assert missing.value.body == {
        "message": "the model 'gpt-4o' does not exist; this router serves 'smollm2'",
        "type": "not_found_error",
        "param": "model",
        "code": "model_not_found",
    }


def test_anthropic_client_gets_anthropic_model_objects(frontend: Frontend) -> None:
    with anthropic.Anthropic(base_url=frontend.url, api_key="unused", max_retries=0) as client:
        page = client.models.list()
        one = client.models.retrieve("smollm2")
        with pytest.raises(anthropic.NotFoundError) as missing:
            client.models.retrieve("claude-sonnet-4-5")
        with pytest.raises(anthropic.BadRequestError) as bad_limit:
            client.models.list(limit=0)
        after = client.models.list(after_id="smollm2")
    (listed,) = page.data
    for model in (listed, one):
        assert model.model_dump(exclude_none=True) == {
            "type": "model",
            "id": "smollm2",
            "display_name": HUB_ID,
            "created_at": model.created_at,
            "lifecycle": "active",
            "max_input_tokens": 2048,
            "max_tokens": 2047,
        }
        assert model.created_at.isoformat() == "1970-01-01T00:00:00+00:00"  # release unknown
    assert (page.has_more, page.first_id, page.last_id) == (False, "smollm2", "smollm2")
    assert (after.data, after.has_more, after.first_id) == ([], False, None)
    assert missing.value.body == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": "model: the model 'claude-sonnet-4-5' does not exist; "
            "this router serves 'smollm2'",
        },
    }
    assert bad_limit.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "limit: must be an integer from 1 to 1000, got '0'",
        },
    }


def test_anthropic_clients_key_is_read_from_x_api_key_on_models() -> None:
    keyed = Frontend(
        ByteTokenizer(256, eos_token_ids=[0]), "smollm2", api_keys=("k1",), context_length=64
    )
    try:
        with anthropic.Anthropic(base_url=keyed.url, api_key="k1", max_retries=0) as client:
            assert client.models.retrieve("smollm2").id == "smollm2"
        wrong = anthropic.Anthropic(base_url=keyed.url, api_key="k2", max_retries=0)
        with wrong, pytest.raises(anthropic.AuthenticationError) as denied:
            wrong.models.list()
        assert denied.value.body == {
            "type": "error",
            "error": {
                "type": "authentication_error",
                "message": "missing or wrong API key (send `x-api-key: <key>` or "
                "`Authorization: Bearer <key>`)",
            },
        }
    finally:
        keyed.close()


# ---- /get_model_info ---------------------------------------------------------------------------


def test_model_path_is_the_model_id_and_the_template_has_its_own_field(
    frontend: Frontend,
) -> None:
    for path in ("/get_model_info", "/model_info"):
        info = requests.get(frontend.url + path, timeout=30).json()
        assert info == {
            "model_path": HUB_ID,
            "served_model_name": "smollm2",
            "tokenizer_path": HUB_ID,
            "chat_template": "chatml",
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "context_length": 2048,
        }


def test_sglang_frontend_still_picks_chatml(frontend: Frontend) -> None:
    if not (SGLANG_SITE / "sglang").is_dir():
        pytest.fail(f"the sglang frontend is not installed in {SGLANG_SITE} (`make setup`)")
    program = (
        "import json, sys, sglang as sgl\n"
        "backend = sgl.RuntimeEndpoint(sys.argv[1])\n"
        "print(json.dumps([backend.get_model_name(), backend.get_chat_template().name]))\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{SGLANG_SITE}"}
    proc = subprocess.run(
        [sys.executable, "-c", program, frontend.url],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    name, template = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (name, template) == (f"{HUB_ID} (chat template: chatml, as TinyLlama's)", "chatml")


def test_only_sglangs_request_is_told_apart() -> None:
    sglang = {"User-Agent": "Python-urllib/3.12", "Content-Type": "application/json; charset=utf-8"}
    assert is_sglang_frontend(sglang)
    assert not is_sglang_frontend({"User-Agent": "Python-urllib/3.12"})  # urllib, no JSON
    assert not is_sglang_frontend({**sglang, "User-Agent": "python-requests/2.34.2"})
    assert not is_sglang_frontend({**sglang, "User-Agent": "curl/8.5.0"})
    assert not is_sglang_frontend({})

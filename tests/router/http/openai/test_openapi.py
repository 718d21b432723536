"""GET /openapi.json: a valid OpenAPI 3.1 document that describes every route served."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openapi_spec_validator import validate

import radixmesh
from radixmesh.tokenizer import ByteTokenizer
from tests.router.http.openai.frontend import Frontend


@pytest.fixture(scope="module")
def frontend() -> Iterator[Frontend]:
    f = Frontend(ByteTokenizer(256, eos_token_ids=[0]), "dummy:tiny")
    yield f
    f.close()


def test_the_description_validates_and_lists_every_route(frontend: Frontend) -> None:
    resp = frontend.http.get("/openapi.json")
    assert resp.status_code == 200
    doc = resp.json()
    validate(doc)  # raises on an invalid document
    assert doc["openapi"] == "3.1.0"
    assert doc["info"]["version"] == radixmesh.__version__
    app = frontend.frontend.build_app()
    served = {
        (r.method.lower(), r.resource.canonical)
        for r in app.router.routes()
        if r.resource is not None and r.method != "HEAD"
    }
    described = {(m, path) for path, ops in doc["paths"].items() for m in ops}
    assert served == described


def test_bodies_and_errors_are_described(frontend: Frontend) -> None:
    doc = frontend.http.get("/openapi.json").json()
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    ref = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert {"messages", "tools", "tool_choice", "logit_bias"} <= set(schema["properties"])
    assert schema["required"] == ["model", "messages"]
    assert set(chat["responses"]) == {"200", "400", "401", "404", "429", "503"}
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    assert "security" not in doc["paths"]["/health"]["get"]

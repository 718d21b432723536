"""Stored responses (retrieve, delete, input items), the input-token count and the output
text's logprobs, through OpenAI's own client against the shared smollm2 router and worker.

Greedy decoding throughout; the logprobs are compared with the chat completion's for the
same prompt, both requests served from the same cache state (a first request caches the
prompt), so both compute the same tokens the same way.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.router.agents.conftest import MODEL, AgentsCluster
from tests.router.http_helpers import Http

LOGPROBS: Any = ["message.output_text.logprobs"]


def create(client: openai.OpenAI, **kwargs: Any) -> Any:
    kwargs.setdefault("max_output_tokens", 6)
    return client.responses.create(model=MODEL, temperature=0, **kwargs)


def not_found(call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    with pytest.raises(openai.NotFoundError) as e:
        call(*args, **kwargs)
    body: dict[str, Any] = e.value.body  # type: ignore[assignment]
    return body


def test_retrieve_then_delete(agents: AgentsCluster) -> None:
    client = agents.openai
    r = create(client, input="Name a colour.", metadata={"k": "v"})
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    client.responses.delete(r.id)  # the client returns nothing; a 404 would raise
    body = not_found(client.responses.retrieve, r.id)
    assert (body["param"], body["code"]) == ("response_id", "response_not_found")
    assert r.id in body["message"]
    not_found(client.responses.delete, r.id)
    not_found(client.responses.input_items.list, r.id)
    # Deleted: it cannot be continued either.
    body = not_found(create, client, previous_response_id=r.id, input="And another?")
    assert body["param"] == "previous_response_id"


def test_a_response_is_its_callers(agents: AgentsCluster) -> None:
    r = create(agents.openai, input="Hi")  # the client's key: "unused"
    path = f"/v1/responses/{r.id}"
    other = Http(agents.http.port, api_key="another")  # the router takes any key here
    assert other.get(path).json()["error"]["param"] == "response_id"
    assert other.request("DELETE", path).status_code == 404
    owner = Http(agents.http.port, api_key="unused")
    assert owner.get(path).json()["id"] == r.id
    resp = owner.request("DELETE", path)
    assert resp.status_code == 200
    assert resp.json() == {"id": r.id, "object": "response", "deleted": True}


def test_store_false_keeps_nothing(agents: AgentsCluster) -> None:
    client = agents.openai
    r = create(client, input="Hi", store=False)
    assert r.store is False
    assert not_found(client.responses.retrieve, r.id)["param"] == "response_id"
    not_found(client.responses.input_items.list, r.id)
    not_found(client.responses.delete, r.id)
    with client.responses.stream(
        model=MODEL, input="Hi", store=False, max_output_tokens=4, temperature=0
    ) as stream:
        events = list(stream)  # cut at 4 tokens or not: its last event ends the response
    assert events[-1].type in ("response.completed", "response.incomplete")
    not_found(client.responses.retrieve, events[-1].response.id)


def test_input_items_list_the_conversation(agents: AgentsCluster) -> None:
    client = agents.openai
    first = create(client, instructions="Be brief.", input="My name is Ada.")
    second = create(
        client,
        previous_response_id=first.id,
        input=[{"role": "user", "content": "What is my name?"}],
    )
    items: list[Any] = list(client.responses.input_items.list(second.id))  # newest first
    assert [(i.type, i.role) for i in items] == [
        ("message", "user"),
        ("message", "assistant"),
        ("message", "user"),
    ]
    assert items[0].content[0].text == "What is my name?"
    assert items[1].id == first.output[0].id
    assert items[1].content[0].text == first.output_text
    assert items[2].content[0].text == "My name is Ada."
    assert [i.status for i in items] == ["completed", first.output[0].status, "completed"]
    # One item a page: the client follows `after` through every page, in either order.
    paged = list(client.responses.input_items.list(second.id, limit=1, order="asc"))
    assert [i.id for i in paged] == [i.id for i in reversed(items)]
    page = client.responses.input_items.list(second.id, limit=2)
    assert ([i.id for i in page.data], page.has_more) == ([i.id for i in items[:2]], True)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.input_items.list(second.id, limit=101)
    assert e.value.body["param"] == "limit"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.input_items.list(second.id, after="msg_unknown")
    assert e.value.body["param"] == "after"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.retrieve(second.id, stream=True)
    assert e.value.body["param"] == "stream"  # type: ignore[index]


def test_input_tokens_count_what_create_prefills(agents: AgentsCluster) -> None:
    client = agents.openai
    fields: dict[str, Any] = {"instructions": "Be brief.", "input": "Count these tokens."}
    count = client.responses.input_tokens.count(model=MODEL, **fields)
    assert count.object == "response.input_tokens"
    r = create(client, **fields)
    assert count.input_tokens == r.usage.input_tokens
    more = client.responses.input_tokens.count(
        model=MODEL, previous_response_id=r.id, input="And these?"
    )
    follow = create(client, previous_response_id=r.id, input="And these?")
    assert more.input_tokens == follow.usage.input_tokens
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.input_tokens.count(model="gpt-9", input="hi")
    assert e.value.body["param"] == "model"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.input_tokens.count(previous_response_id="resp_unknown", input="hi")
    assert e.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_logprobs_are_the_chat_completions(agents: AgentsCluster) -> None:
    client = agents.openai
    question = "Name three primary colours."
    messages: Any = [{"role": "user", "content": question}]
    # Caches the prompt: the requests below start from the same cached prefix.
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, temperature=0)
    chat = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    expected = [lp.model_dump() for lp in chat.choices[0].logprobs.content]  # type: ignore[union-attr]
    assert len(expected) == chat.usage.completion_tokens  # type: ignore[union-attr]
    r = create(client, input=question, max_output_tokens=8, top_logprobs=2, include=LOGPROBS)
    part = r.output[0].content[0]
    assert r.output_text == chat.choices[0].message.content
    assert [lp.model_dump() for lp in part.logprobs] == expected
    assert r.top_logprobs == 2
    with client.responses.stream(
        model=MODEL, input=question, max_output_tokens=8, temperature=0, include=LOGPROBS
    ) as stream:
        events: list[Any] = list(stream)
    final = events[-1].response  # incomplete: cut at 8 tokens
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    streamed = [lp for d in deltas for lp in d.logprobs]
    done = next(e for e in events if e.type == "response.output_text.done")
    # `include` alone: the chosen tokens, no alternatives.
    without_tops = [
        {"token": t["token"], "logprob": t["logprob"], "top_logprobs": []} for t in expected
    ]
    assert [lp.model_dump() for lp in done.logprobs] == without_tops
    assert [lp.model_dump() for lp in streamed] == without_tops[: len(streamed)]
    assert "".join(d.delta for d in deltas) == final.output_text == r.output_text
    final_part = final.output[0].content[0]
    assert [lp.model_dump() for lp in final_part.logprobs] == [
        {**t, "top_logprobs": []} for t in expected
    ]
    plain = create(client, input=question, max_output_tokens=2)
    assert plain.output[0].content[0].logprobs == []

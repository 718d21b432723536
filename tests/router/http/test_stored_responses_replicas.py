"""Stored responses through two router replicas: created through one, retrieved, continued,
listed and deleted through the other, because the entries live on the worker the id
names (router/http/openai/responses_api/worker_store.py).

The replicas: the shared smollm2 cluster's router (tests/router/conftest.py) and a second
`radixmesh router` process with its own HTTP port in front of the same worker. Greedy
decoding; every assertion compares what one replica answered with what the other did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.router.config import RouterConfig
from radixmesh.router.http.openai.responses_api.store import StoredResponse
from radixmesh.router.http.openai.responses_api.worker_store import (
    WorkerResponseStore,
    holder_epoch,
    response_id_on,
)
from radixmesh.router.pool import WorkerPool
from tests.router.http_helpers import Http
from tests.router.routers import ExtraRouter
from tests.router.smollm2_http import MODEL

pytestmark = pytest.mark.slow

PATH = "/v1/responses"


@pytest.fixture(scope="module")
def replicas(smollm2_http: tuple[LocalCluster, int]) -> Iterator[tuple[Http, Http]]:
    cluster, http_port = smollm2_http
    with ExtraRouter(cluster, http=True) as other:
        assert other.http_port is not None
        yield Http(http_port, api_key="k"), Http(other.http_port, api_key="k")


def create(http: Http, **fields: Any) -> dict[str, Any]:
    body = {"model": MODEL, "temperature": 0, "max_output_tokens": 4, **fields}
    resp = http.post(PATH, body)
    assert resp.status_code == 200, resp.text
    reply: dict[str, Any] = resp.json()
    return reply


def not_found(resp: Any, param: str, rid: str) -> None:
    assert resp.status_code == 404, resp.text
    error = resp.json()["error"]
    assert (error["param"], error["type"]) == (param, "not_found_error")
    assert rid in error["message"]


def test_create_on_one_replica_continue_and_delete_on_the_other(
    replicas: tuple[Http, Http],
) -> None:
    a, b = replicas
    first = create(a, input="My name is Ada.")
    assert holder_epoch(first["id"])  # the id names the worker that holds it
    assert b.get(f"{PATH}/{first['id']}").json() == first
    items = b.get(f"{PATH}/{first['id']}/input_items").json()
    assert [i["content"][0]["text"] for i in items["data"]] == ["My name is Ada."]

    second = create(b, previous_response_id=first["id"], input="What is my name?")
    assert second["previous_response_id"] == first["id"]
    assert a.get(f"{PATH}/{second['id']}").json() == second
    listed = a.get(f"{PATH}/{second['id']}/input_items?order=asc").json()["data"]
    assert [(i["role"], i["content"][0]["text"]) for i in listed] == [
        ("user", "My name is Ada."),
        ("assistant", first["output"][0]["content"][0]["text"]),
        ("user", "What is my name?"),
    ]
    assert listed[1]["id"] == first["output"][0]["id"]

    deleted = b.request("DELETE", f"{PATH}/{first['id']}")
    assert deleted.json() == {"id": first["id"], "object": "response", "deleted": True}
    not_found(a.get(f"{PATH}/{first['id']}"), "response_id", first["id"])
    not_found(a.request("DELETE", f"{PATH}/{first['id']}"), "response_id", first["id"])
    gone = a.post(PATH, {"model": MODEL, "previous_response_id": first["id"], "input": "Hi"})
    not_found(gone, "previous_response_id", first["id"])
    assert b.get(f"{PATH}/{second['id']}").json() == second  # its own entry, whole


def test_another_callers_and_unknown_holders_are_404s(replicas: tuple[Http, Http]) -> None:
    a, b = replicas
    r = create(a, input="Hi")
    stranger = Http(b.port, api_key="another")
    not_found(stranger.get(f"{PATH}/{r['id']}"), "response_id", r["id"])
    not_found(stranger.request("DELETE", f"{PATH}/{r['id']}"), "response_id", r["id"])
    assert b.get(f"{PATH}/{r['id']}").json() == r  # still there for its owner
    for rid in (response_id_on(12345), "resp_" + "0" * 48, "resp_short"):  # no such worker
        not_found(b.get(f"{PATH}/{rid}"), "response_id", rid)
    r2 = create(a, input="Hi", store=False)
    not_found(b.get(f"{PATH}/{r2['id']}"), "response_id", r2["id"])


def test_a_holder_that_is_gone_reads_as_unknown() -> None:
    """A worker that does not answer (here: nothing listens on its port): the store says
    not found / not stored instead of raising, which the routes answer as 404."""

    async def run() -> tuple[object, bool, bool]:
        pool = WorkerPool(RouterConfig(workers=(f"127.0.0.1:{free_port()}",)))
        handle = next(iter(pool.workers.values()))
        handle.summary.epoch = 7
        store = WorkerResponseStore(pool, ttl=60.0, max_entry_bytes=1 << 20)
        rid = store.new_id(handle.worker_id)
        assert holder_epoch(rid) == 7
        entry = StoredResponse({"id": rid, "output": []}, ())
        try:
            return (
                await store.get("c", rid),
                await store.delete("c", rid),
                await store.put("c", entry),
            )
        finally:
            await pool.close()

    assert asyncio.run(run()) == (None, False, False)

"""End to end on the bundled model: `radixmesh launch`'s cluster, the SDK, chat messages.

The router tokenizes the messages with the model's chat template; the greedy answer
through router and worker must equal the in-process engine's on the same template, and
streaming must deliver the same tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from radixmesh.client import Client
from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Name three primary colors."}]
PARAMS = {"max_new_tokens": 12, "temperature": 0.0}


def test_chat_through_the_router_equals_the_engine(smollm2_gguf: Path) -> None:
    from radixmesh.worker.engine import Engine

    config = LaunchSpec(model="smollm2", workers=2, port=free_port(), ready_timeout=240.0)
    with LocalCluster(config) as cluster, Client(cluster.address) as client:
        done = client.generate(messages=MESSAGES, sampling_params=PARAMS)
        streamed = [
            t
            for chunk in client.generate(messages=MESSAGES, sampling_params=PARAMS, stream=True)
            for t in chunk.token_ids
        ]
        info = client.model_info()
    engine = Engine(model="smollm2")
    try:
        ids = engine.tokenizer.encode_chat(MESSAGES)
        local = engine.generate(input_ids=ids, sampling_params=PARAMS)
    finally:
        engine.shutdown()
    assert isinstance(local, dict)
    assert info.model == "smollm2"
    assert done.prompt_tokens == len(ids)
    assert done.token_ids == local["output_ids"]
    assert streamed == local["output_ids"]
    assert done.text == local["text"]

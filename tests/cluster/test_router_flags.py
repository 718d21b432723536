"""The router's flags are RouterConfig's fields (cluster/router_flags.py)."""

from __future__ import annotations

import dataclasses

from radixmesh.cluster.cli import build_parser
from radixmesh.cluster.router_flags import HAND_WRITTEN, field_docs, router_options
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.router.config import RouterConfig


def test_every_router_setting_is_documented_and_a_flag() -> None:
    docs = field_docs(RouterConfig)
    names = {f.name for f in dataclasses.fields(RouterConfig)}
    assert set(docs) == names
    args = build_parser().parse_args(["router", "--workers", "a:1"])
    assert set(router_options(args, launch=False)) == names - HAND_WRITTEN


def test_router_flags_build_the_config_they_name() -> None:
    args = build_parser().parse_args(
        ["router", "--workers", "a:1,b:2", "--seed", "7", "--tentative-ttl", "2.5",
         "--strict-openai", "--http-port", "8000", "--max-attempts", "2",
         "--policy", "round_robin", "--tool-call-parser", "hermes"]
    )  # fmt: skip
    config = RouterConfig(workers=("a:1", "b:2"), **router_options(args, launch=False))
    assert config == RouterConfig(
        workers=("a:1", "b:2"),
        seed=7,
        tentative_ttl=2.5,
        strict_openai=True,
        http_port=8000,
        max_attempts=2,
        policy="round_robin",
        tool_call_parser="hermes",
    )


def test_launch_hands_its_routers_what_differs_from_the_defaults() -> None:
    args = build_parser().parse_args(
        ["launch", "--model", "dummy:tiny", "--queue-timeout", "3", "--strict-openai",
         "--no-per-request-streams", "--request-cost-tokens", "16"]
    )  # fmt: skip
    options = router_options(args, launch=True)
    assert options == {"queue_timeout": 3.0, "strict_openai": True, "request_cost_tokens": 16}
    spec = LaunchSpec(model="dummy:tiny", router_options=options)
    # What the launcher's routers are started with parses back to the same config.
    flags = ["router", "--workers", "w:1", *spec.router_flags()]
    routed = router_options(build_parser().parse_args(flags), launch=False)
    assert RouterConfig(workers=("w:1",), **routed) == dataclasses.replace(
        spec.router_config(("w:1",)), host="0.0.0.0", port=50050
    )

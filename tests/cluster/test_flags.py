"""The settings' flags are their dataclasses' fields (cluster/flags.py): the router's are
RouterConfig's (cluster/router_flags.py); the launcher's own are LaunchSpec's, RestartPolicy's
and RayOptions' (cluster/launch_flags.py), and its worker group some of ModelConfig's; the
engine options of `radixmesh worker` / `generate` are the worker's config parts' fields
(cluster/cli.py `add_engine_options`)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from radixmesh.cluster.child import RestartPolicy
from radixmesh.cluster.cli import build_parser, main
from radixmesh.cluster.flags import field_docs, flag_name, merged_field_docs
from radixmesh.cluster.launch_flags import (
    NOT_FLAGS,
    WORKER_OPTIONS,
    add_launch_flags,
    launch_spec,
    spec_fields,
)
from radixmesh.cluster.router_flags import HAND_WRITTEN, add_router_flags, router_options
from radixmesh.cluster.spec import LaunchSpec, RayOptions
from radixmesh.errors import InvalidArgument
from radixmesh.router.config import RouterConfig
from radixmesh.worker.config import (
    OPTION_CLASSES,
    EngineConfig,
    GrammarConfig,
    ModelConfig,
    ParallelConfig,
    option_fields,
)

LAUNCH_GROUPS: tuple[tuple[type, Any], ...] = (
    (LaunchSpec, spec_fields()),
    (RestartPolicy, dataclasses.fields(RestartPolicy)),
    (RayOptions, dataclasses.fields(RayOptions)),
    (ModelConfig, [f for f in dataclasses.fields(ModelConfig) if f.name in WORKER_OPTIONS]),
)
NO_KEYS: dict[str, Any] = {"api_keys": (), "admin_keys": (), "worker_api_key": None}


def _check_flags(parser: argparse.ArgumentParser, cls: type, fields: Any) -> None:
    """Each field is the flag of its name, with the field's default and its docstring as
    the help (and the default, but for a bool: --x / --no-x)."""
    docs = field_docs(cls)
    actions = parser._option_string_actions
    for f in fields:
        action = actions[flag_name(f.name)]
        assert (action.dest, action.default) == (f.name, f.default), f.name
        bool_flag = isinstance(action, argparse.BooleanOptionalAction)
        assert action.help == (
            docs[f.name] if bool_flag else f"{docs[f.name]} (default: {f.default})"
        )


def _subcommand(name: str) -> argparse.ArgumentParser:
    """The parser of `radixmesh <name>`, as build_parser makes it."""
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    parser = sub.choices[name]
    assert isinstance(parser, argparse.ArgumentParser)
    return parser


def test_every_engine_option_is_documented_and_a_flag() -> None:
    # Each field of each worker config part, and attention_backend, has a docstring...
    for cls in OPTION_CLASSES.values():
        assert set(field_docs(cls)) == {f.name for f in dataclasses.fields(cls)}, cls
    assert set(field_docs(EngineConfig)) == {"attention_backend"}
    (backend,) = [f for f in dataclasses.fields(EngineConfig) if f.name == "attention_backend"]
    fields = {name: f for name, f in option_fields()}
    # ...which `radixmesh worker` and `radixmesh generate` show as the flag's help.
    for command in ("worker", "generate"):
        parser = _subcommand(command)
        for cls in OPTION_CLASSES.values():
            _check_flags(parser, cls, [fields[f.name] for f in dataclasses.fields(cls)])
        _check_flags(parser, EngineConfig, [backend])
    help_text = " ".join(_subcommand("worker").format_help().split())
    assert field_docs(GrammarConfig)["grammar_compile_timeout"] in help_text


def test_merged_docs_refuse_a_name_documented_twice() -> None:
    docs = merged_field_docs(OPTION_CLASSES.values())
    assert len(docs) == len(option_fields())
    assert docs["tp_timeout"] == field_docs(ParallelConfig)["tp_timeout"]
    with pytest.raises(ValueError, match=r"ModelConfig documents \[.*'model'"):
        merged_field_docs([ModelConfig, ModelConfig])


def test_every_router_setting_is_documented_and_a_flag() -> None:
    docs = field_docs(RouterConfig)
    names = {f.name for f in dataclasses.fields(RouterConfig)}
    assert set(docs) == names
    args = build_parser().parse_args(["router", "--workers", "a:1"])
    assert set(router_options(args, launch=False)) == names - HAND_WRITTEN
    parser = argparse.ArgumentParser()
    add_router_flags(parser, launch=False)
    _check_flags(
        parser,
        RouterConfig,
        [f for f in dataclasses.fields(RouterConfig) if f.name not in HAND_WRITTEN],
    )


def test_router_flags_build_the_config_they_name() -> None:
    args = build_parser().parse_args(
        ["router", "--workers", "a:1,b:2", "--seed", "7", "--tentative-ttl", "2.5",
         "--no-strict-openai", "--http-port", "8000", "--max-attempts", "2",
         "--policy", "round_robin", "--tool-call-parser", "hermes", "--host-hit-cost", "1"]
    )  # fmt: skip
    config = RouterConfig(workers=("a:1", "b:2"), **router_options(args, launch=False))
    assert config == RouterConfig(
        workers=("a:1", "b:2"),
        seed=7,
        tentative_ttl=2.5,
        strict_openai=False,
        http_port=8000,
        max_attempts=2,
        policy="round_robin",
        tool_call_parser="hermes",
        host_hit_cost=1.0,
    )


def test_launch_hands_its_routers_what_differs_from_the_defaults() -> None:
    args = build_parser().parse_args(
        ["launch", "--model", "dummy:tiny", "--queue-timeout", "3", "--no-strict-openai",
         "--no-per-request-streams", "--request-cost-tokens", "16"]
    )  # fmt: skip
    options = router_options(args, launch=True)
    assert options == {"queue_timeout": 3.0, "strict_openai": False, "request_cost_tokens": 16}
    spec = LaunchSpec(model="dummy:tiny", router_options=options)
    # What the launcher's routers are started with parses back to the same config.
    flags = ["router", "--workers", "w:1", *spec.router_flags()]
    routed = router_options(build_parser().parse_args(flags), launch=False)
    assert RouterConfig(workers=("w:1",), **routed) == dataclasses.replace(
        spec.router_config(("w:1",)), host="0.0.0.0", port=50050
    )


def test_every_launch_setting_is_documented_and_a_flag() -> None:
    # The flags are the fields but those set another way; each has a docstring.
    names = {f.name for f in dataclasses.fields(LaunchSpec)}
    assert {f.name for f in spec_fields()} == names - NOT_FLAGS
    assert set(field_docs(LaunchSpec)) == names - NOT_FLAGS | {"ray"}
    for group in (RestartPolicy, RayOptions):
        assert set(field_docs(group)) == {f.name for f in dataclasses.fields(group)}
    assert set(WORKER_OPTIONS) <= set(field_docs(ModelConfig))
    parser = argparse.ArgumentParser()
    add_launch_flags(parser)
    for cls, fields in LAUNCH_GROUPS:
        _check_flags(parser, cls, [f for f in fields if f.name != "model"])
    model = parser._option_string_actions["--model"]
    assert (model.required, model.help) == (True, field_docs(LaunchSpec)["model"])
    assert parser._option_string_actions["--ray"].help == field_docs(LaunchSpec)["ray"]


def test_launch_help_lists_every_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "2000")  # one line per flag: no wrapped docstrings
    with pytest.raises(SystemExit) as done:
        main(["launch", "--help"])
    assert done.value.code == 0
    # Each flag's entry: its line, and its help's on the next when the flag is long.
    entries = ["  -" + e for e in capsys.readouterr().out.split("\n  -")[1:]]
    for cls, fields in LAUNCH_GROUPS:
        docs = field_docs(cls)
        for f in fields:
            # A bool's entry starts "--x, --no-x".
            (entry,) = [e for e in entries if e.split()[0].rstrip(",") == flag_name(f.name)]
            assert docs[f.name] in " ".join(entry.split())
    assert any(e.startswith("  --device {auto,cuda,cpu}, --ray-device ") for e in entries)


def test_launch_defaults_build_the_default_spec() -> None:
    args = build_parser().parse_args(["launch", "--model", "m", "--device", "cpu"])
    # --device cpu: a local launch tells each worker, and asks no GPU count of torch.
    assert launch_spec(args, **NO_KEYS) == LaunchSpec(
        model="m", device="cpu", worker_args=("--device", "cpu")
    )


def test_launch_flags_build_the_spec_they_name() -> None:
    args = build_parser().parse_args(
        ["launch", "--model", "m", "--workers", "3", "--routers", "2", "--policy", "round_robin",
         "--host", "0.0.0.0", "--port", "6000", "--tp-size", "2", "--ray-device", "cuda",
         "--worker-args", "--page-size 4", "--tls-cert", "c.pem", "--tls-key", "k.pem",
         "--ready-timeout", "60", "--stop-timeout", "2", "--workers-per-gpu", "2",
         "--max-restarts", "0", "--restart-backoff", "0.5", "--max-restart-backoff", "4",
         "--restart-window", "30", "--ray-address", "auto", "--cpus-per-worker", "0.5",
         "--router-cpus", "1", "--placement-strategy", "PACK", "--worker-metrics-port", "9091",
         "--resolve-timeout", "3", "--router-placement", "spread", "--dtype", "float32",
         "--revision", "v1", "--seed", "7"]
    )  # fmt: skip
    assert launch_spec(args, api_keys=("k",), admin_keys=(), worker_api_key="w") == LaunchSpec(
        model="m", workers=3, routers=2, policy="round_robin", host="0.0.0.0", port=6000,
        tp_size=2, device="cuda", worker_args=("--page-size", "4", "--revision", "v1",
        "--dtype", "float32"), tls_cert="c.pem", tls_key="k.pem", ready_timeout=60.0,
        stop_timeout=2.0, workers_per_gpu=2, router_options={"seed": 7}, api_keys=("k",),
        worker_api_key="w", restart=RestartPolicy(0, 0.5, 4.0, 30.0),
        # --max-restarts, not --ray-max-restarts: Ray takes it too.
        ray=RayOptions("auto", 0.5, 1.0, 0, "PACK", 9091, 3.0, "spread"),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "ray_max_restarts"),
    [([], -1), (["--max-restarts", "5"], 5), (["--ray-max-restarts", "2"], 2),
     (["--max-restarts", "0", "--ray-max-restarts", "3"], 3)],
)  # fmt: skip
def test_ray_takes_max_restarts_unless_given_its_own(
    argv: list[str], ray_max_restarts: int
) -> None:
    args = build_parser().parse_args(["launch", "--model", "m", "--ray", *argv])
    spec = launch_spec(args, **NO_KEYS)
    assert spec.ray is not None and spec.ray.ray_max_restarts == ray_max_restarts


def test_launch_refuses_two_devices() -> None:
    args = build_parser().parse_args(
        ["launch", "--model", "m", "--device", "cuda", "--worker-args", "--device cpu"]
    )
    with pytest.raises(InvalidArgument) as err:
        launch_spec(args, **NO_KEYS)
    assert err.value.field == "device"


def test_launch_deterministic_reaches_workers_and_routers() -> None:
    """--deterministic: every worker runs the mode and every router requires it."""
    args = build_parser().parse_args(
        ["launch", "--model", "m", "--device", "cpu", "--deterministic"]
    )
    spec = launch_spec(args, **NO_KEYS)
    assert spec.worker_args == ("--deterministic", "--device", "cpu")
    assert spec.router_options == {"require_deterministic": True}


@pytest.mark.parametrize("routers", [1, 3])
def test_every_launcher_gives_each_router_replica_its_share(routers: int) -> None:
    # Local replicas get flags, Ray's router actors a config: the same partition.
    spec = LaunchSpec(model="dummy:tiny", routers=routers)
    for index in range(routers):
        flags = ["router", "--workers", "w:1", *spec.replica_flags(index)]
        local = RouterConfig(
            workers=("w:1",), **router_options(build_parser().parse_args(flags), launch=False)
        )
        ray = spec.router_config(("w:1",), index)  # what RouterActor `index` serves with
        assert (local.replicas, local.replica_index) == (ray.replicas, ray.replica_index)
        assert (ray.replicas, ray.replica_index) == (routers, index)
        assert local.listen_when_serving == (routers > 1)
    with pytest.raises(InvalidArgument, match="router_options: set 'replica_index'"):
        LaunchSpec(model="dummy:tiny", router_options={"replica_index": 1})

"""The router's flags, generated from `RouterConfig` (by flags.py): one flag per field, named
after it, its help the field's docstring and its default the field's.

`radixmesh router` takes every field as a flag but those given another way (the worker
list, the keys: `HAND_WRITTEN`); `radixmesh launch` takes those the launcher does not set
itself (`SET_BY_LAUNCH`) and hands the ones given other values than the defaults to each
router it starts. So a new router setting is a field with a docstring, nothing more.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from radixmesh.cluster.flags import add_field_flags, field_docs
from radixmesh.router.config import TOOL_CALL_PARSERS, RouterConfig

# Given by hand: the worker list (comma-separated), the API and admin keys (repeatable,
# else from the environment), and the key for the workers (only from the environment:
# a flag would show it in `ps`).
HAND_WRITTEN = frozenset({"workers", "api_keys", "admin_keys", "worker_api_key"})
# What `radixmesh launch` decides for its routers: its own flags (host, port, policy, TLS,
# the hub cache, shared with the workers), the replicas' listening, and the router -> worker
# TLS and DNS discovery that a local launch does not use.
SET_BY_LAUNCH = HAND_WRITTEN | {
    "host", "port", "policy", "tls_cert", "tls_key", "tls_client_ca", "download_dir",
    "listen_when_serving", "discovery_interval", "worker_tls_ca", "worker_tls_cert",
    "worker_tls_key", "worker_tls_server_name", "replicas", "replica_index",
}  # fmt: skip


def _choices() -> dict[str, tuple[str, ...]]:
    from radixmesh.router.policy import POLICIES

    return {"policy": tuple(sorted(POLICIES)), "tool_call_parser": TOOL_CALL_PARSERS}


def flag_fields(*, launch: bool) -> list[dataclasses.Field[Any]]:
    """RouterConfig's fields that are flags of `radixmesh launch` (else `router`)."""
    skip = SET_BY_LAUNCH if launch else HAND_WRITTEN
    return [f for f in dataclasses.fields(RouterConfig) if f.name not in skip]


def add_router_flags(parser: argparse.ArgumentParser, *, launch: bool) -> None:
    group = parser.add_argument_group("router (every RouterConfig field: router/config.py)")
    add_field_flags(group, flag_fields(launch=launch), field_docs(RouterConfig), choices=_choices())


def router_options(args: argparse.Namespace, *, launch: bool) -> dict[str, Any]:
    """The router flags' values; for `launch`, only those other than the defaults (the
    routers it starts get them as flags)."""
    values = {f.name: getattr(args, f.name) for f in flag_fields(launch=launch)}
    if not launch:
        return values
    defaults = {f.name: f.default for f in flag_fields(launch=True)}
    return {name: v for name, v in values.items() if v != defaults[name]}

"""The router's flags, generated from `RouterConfig`: one flag per field, named after it,
its help the field's docstring and its default the field's.

`radixmesh router` takes every field as a flag but those given another way (the worker
list, the keys: `HAND_WRITTEN`); `radixmesh launch` takes those the launcher does not set
itself (`SET_BY_LAUNCH`) and hands the ones given other values than the defaults to each
router it starts. So a new router setting is a field with a docstring, nothing more.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import textwrap
import types
import typing
from functools import cache
from typing import Any

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
    "worker_tls_key", "worker_tls_server_name",
}  # fmt: skip


def _choices() -> dict[str, tuple[str, ...]]:
    from radixmesh.router.policy import POLICIES

    return {"policy": tuple(sorted(POLICIES)), "tool_call_parser": TOOL_CALL_PARSERS}


@cache
def field_docs(cls: type) -> dict[str, str]:
    """A dataclass's attribute docstrings (the string under each field), one line each."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def flag_fields(*, launch: bool) -> list[dataclasses.Field[Any]]:
    """RouterConfig's fields that are flags of `radixmesh launch` (else `router`)."""
    skip = SET_BY_LAUNCH if launch else HAND_WRITTEN
    return [f for f in dataclasses.fields(RouterConfig) if f.name not in skip]


def add_router_flags(parser: argparse.ArgumentParser, *, launch: bool) -> None:
    group = parser.add_argument_group("router (every RouterConfig field: router/config.py)")
    docs, choices = field_docs(RouterConfig), _choices()
    for f in flag_fields(launch=launch):
        flag = "--" + f.name.replace("_", "-")
        kind = base_type(f.type)
        text = f"{docs[f.name]} (default: {f.default})"
        if kind is bool:
            group.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default,
                help=docs[f.name],
            )  # fmt: skip
        else:
            group.add_argument(
                flag, dest=f.name, type=kind, default=f.default, help=text,
                choices=choices.get(f.name),
            )  # fmt: skip


def router_options(args: argparse.Namespace, *, launch: bool) -> dict[str, Any]:
    """The router flags' values; for `launch`, only those other than the defaults (the
    routers it starts get them as flags)."""
    values = {f.name: getattr(args, f.name) for f in flag_fields(launch=launch)}
    if not launch:
        return values
    defaults = {f.name: f.default for f in flag_fields(launch=True)}
    return {name: v for name, v in values.items() if v != defaults[name]}


def base_type(annotation: Any) -> type:
    """'int | None' -> int (annotations are strings under `from __future__ import annotations`)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    if isinstance(annotation, (types.UnionType,)) or typing.get_origin(annotation) is typing.Union:
        text = " | ".join(getattr(a, "__name__", str(a)) for a in typing.get_args(annotation))
    for name, typ in (("bool", bool), ("int", int), ("float", float)):
        if text.split(" | ")[0] == name:
            return typ
    return str

"""Command-line flags generated from frozen config dataclasses: one flag per field.

The router's flags (router_flags.py), the launcher's own (launch_flags.py) and the engine
options (cli.py `add_engine_options`) are all built here, so a setting is said once, in
its dataclass: the flag is `--` + the field's name with `-` for `_` (a field is named for
the command line it appears on: `RayOptions.ray_address`), its type the
field's (`int | None` -> int; a bool is `--name` / `--no-name`), its default the field's
and its help the field's attribute docstring (the string under the field) with the
default. What a field cannot say about itself is given by the caller per field name:
`choices` (a registry of accepted values), `parse` (a type that is not one of the
builtins, e.g. "free" or a port), `aliases` (an older spelling that scripts still use).
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from typing import Any

# The namespace attribute where `Given` records which flags were on the command line.
_GIVEN = "given_flags"


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


def merged_field_docs(classes: Iterable[type]) -> dict[str, str]:
    """`field_docs` of several dataclasses in one mapping, for a flag group whose fields
    come from several (the engine options span the worker's config parts). A name two
    classes both document is refused: one flag cannot show two helps."""
    docs: dict[str, str] = {}
    for cls in classes:
        own = field_docs(cls)
        if shared := own.keys() & docs.keys():
            raise ValueError(f"{cls.__name__} documents {sorted(shared)} again")
        docs.update(own)
    return docs


def base_type(annotation: Any) -> type:
    """'int | None' -> int (annotations are strings under `from __future__ import annotations`)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    if isinstance(annotation, (types.UnionType,)) or typing.get_origin(annotation) is typing.Union:
        text = " | ".join(getattr(a, "__name__", str(a)) for a in typing.get_args(annotation))
    for name, typ in (("bool", bool), ("int", int), ("float", float)):
        if text.split(" | ")[0] == name:
            return typ
    return str


def flag_name(name: str) -> str:
    """The flag of field `name`: `--` + name, dashes for underscores."""
    return "--" + name.replace("_", "-")


class Given(argparse.Action):
    """Stores the value as argparse's default action does, and records that the flag was
    given: a flag whose default is the field's cannot otherwise tell `--x 5` from no
    `--x` when 5 is the default (see `given`)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, _GIVEN, given(namespace) | {self.dest})


def given(args: argparse.Namespace) -> frozenset[str]:
    """The dests of the generated (non-bool) flags given on the command line."""
    return frozenset(getattr(args, _GIVEN, frozenset()))


def add_field_flags(
    group: argparse._ActionsContainer,
    fields: Iterable[dataclasses.Field[Any]],
    docs: Mapping[str, str],
    *,
    choices: Mapping[str, Sequence[Any]] | None = None,
    parse: Mapping[str, tuple[Callable[[str], Any], str]] | None = None,
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """One flag per field (see the module docstring); `parse` maps a field to its value's
    parser and metavar. A field without a default is a required flag; one without a
    docstring gets only its default as help (every config this module serves documents
    each field; tests/cluster/test_flags.py checks it)."""
    for f in fields:
        names = [flag_name(f.name), *(aliases or {}).get(f.name, ())]
        default = None if f.default is dataclasses.MISSING else f.default
        if f.default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        doc = docs.get(f.name, "")
        kind = base_type(f.type)
        if kind is bool:
            group.add_argument(
                *names, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                help=doc or None,
            )  # fmt: skip
            continue
        parser, metavar = (parse or {}).get(f.name, (kind, None))
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        group.add_argument(
            *names, dest=f.name, action=Given, type=parser, default=default, metavar=metavar,
            choices=(choices or {}).get(f.name), required=required,
            help=f"{doc} (default: {default})".lstrip() if not required else doc or None,
        )  # fmt: skip


def field_values(
    args: argparse.Namespace, fields: Iterable[dataclasses.Field[Any]]
) -> dict[str, Any]:
    """The flags' values by field name (what `add_field_flags` parsed)."""
    return {f.name: getattr(args, f.name) for f in fields}

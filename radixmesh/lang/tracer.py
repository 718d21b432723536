"""The tracer: runs a program with placeholder arguments and records its graph.

Arguments become `Placeholder` strings (a marker the model would never write), and
variables read during tracing do too, so ordinary Python string code (f-strings,
concatenation) traces without change. The recorded graph gives the program's constant
prefix: the text every run starts with, up to the first argument, model call or fork.
`run_batch` prefills that prefix once. A prefix is only a cache warm-up, so control flow
that depends on a placeholder can at worst warm the wrong text; results are unaffected.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from radixmesh.lang.chat_template import ChatTemplate
from radixmesh.lang.ir import (
    Constant,
    Expr,
    Gen,
    RoleBegin,
    RoleEnd,
    RoleWriter,
    Select,
    flatten,
    to_expr,
)

_MARK = "\x00"


class Placeholder(str):
    """A traced argument or variable: a string holding a marker."""

    def __new__(cls, name: str) -> Placeholder:
        return super().__new__(cls, f"{_MARK}{name}{_MARK}")


@dataclass
class Fork:
    branches: list[TracerState]


@dataclass
class TracerState(RoleWriter):
    """Duck-types `ProgramState` while tracing; `nodes` is the recorded graph."""

    nodes: list[Expr | Fork] = field(default_factory=list)

    def __iadd__(self, other: object) -> TracerState:
        if isinstance(other, TracerGroup):
            raise TypeError("cannot add a fork group to a state")
        self.nodes.extend(flatten(to_expr(other)))
        return self

    def __getitem__(self, name: str) -> Placeholder:
        return Placeholder(f"var:{name}")

    def get_var(self, name: str) -> Placeholder:
        return self[name]

    def get_meta_info(self, name: str) -> dict[str, Any]:
        return {}

    def fork(self, size: int = 1) -> TracerGroup:
        branches = [TracerState() for _ in range(size)]
        self.nodes.append(Fork(branches))
        return TracerGroup(branches)

    def copy(self) -> TracerState:
        return self.fork(1)[0]

    def text(self) -> str:
        return Placeholder("text")

    def sync(self) -> None:
        pass


@dataclass
class TracerGroup:
    states: list[TracerState]

    def __getitem__(self, i: int) -> TracerState:
        return self.states[i]

    def __iter__(self) -> Any:
        return iter(self.states)

    def __len__(self) -> int:
        return len(self.states)

    def __iadd__(self, other: object) -> TracerGroup:
        for state in self.states:
            state += other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        pass


class Traceable(Protocol):
    """What the tracer needs of a program (`SglFunction`): its body, the names of its
    arguments after the state, and the arguments bound to it already."""

    func: Callable[..., Any]
    arg_names: list[str]
    bind_arguments: dict[str, Any]


def trace_program(fn: Traceable, arguments: dict[str, Any]) -> TracerState:
    """Run `fn` on a tracer state; arguments not given (and without a default) become
    placeholders."""
    params = inspect.signature(fn.func).parameters
    arguments = {**fn.bind_arguments, **arguments}
    args: dict[str, Any] = {}
    for name in fn.arg_names:
        default = params[name].default
        # Placeholders only where no value is known: a default keeps non-text arguments
        # (counts, flags) usable for control flow while tracing.
        args[name] = arguments.get(
            name, Placeholder(name) if default is params[name].empty else default
        )
    state = TracerState()
    fn.func(state, **args)
    return state


def constant_prefix(state: TracerState, template: ChatTemplate) -> str:
    """The text every run of the traced program starts with."""
    parts: list[str] = []
    num_messages = 0
    for node in state.nodes:
        if isinstance(node, Constant):
            head, mark, _ = node.value.partition(_MARK)
            parts.append(head)
            if mark:
                break
        elif isinstance(node, RoleBegin):
            if num_messages == 0 and node.role != "system" and template.default_system_prompt:
                parts.append(template.prefix("system") + template.default_system_prompt)
                parts.append(template.suffix("system"))
                num_messages = 1
            parts.append(template.prefix(node.role))
        elif isinstance(node, RoleEnd):
            parts.append(template.suffix(node.role))
            num_messages += 1
        else:  # Gen, Select, Image, Fork: the text depends on the model from here on
            break
    return "".join(parts)


__all__ = ["Fork", "Gen", "Placeholder", "Select", "TracerState", "constant_prefix"]

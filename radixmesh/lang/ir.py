"""The language's expressions: what `s += ...` appends to a program state.

Expressions are plain data. The interpreter executes them against a backend; the tracer
records them into a graph. Adding expressions (or strings) builds an `ExprList`, so
`s += "Q: " + sgl.gen("a")` is one append of two expressions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from radixmesh.lang.choices import ChoicesSamplingMethod


# What `gen(dtype=...)` constrains the output to (SGLang's patterns). Numbers may end in
# spaces or newlines: that is how a model says the number is over, and the stop strings
# " " and "\n" that come with int and float cut them off again.
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""


class Expr:
    """Base of every expression. Not text: formatting one is a mistake we name."""

    def __add__(self, other: object) -> ExprList:
        return ExprList([*_flatten(self), *_flatten(to_expr(other))])

    def __radd__(self, other: object) -> ExprList:
        return ExprList([*_flatten(to_expr(other)), *_flatten(self)])

    def __str__(self) -> str:
        raise TypeError(
            f"{type(self).__name__} is a language expression, not text: add it to a program "
            "state inside an @function (s += ...) instead of formatting it"
        )

    def __format__(self, spec: str) -> str:
        return self.__str__()


@dataclass(eq=False)
class Constant(Expr):
    value: str


@dataclass(eq=False)
class Gen(Expr):
    """A model call. `params` holds only the sampling arguments the caller set."""

    name: str | None
    params: dict[str, Any] = field(default_factory=dict)
    dtype: type | None = None


@dataclass(eq=False)
class Select(Expr):
    name: str | None
    choices: list[str]
    temperature: float
    choices_method: ChoicesSamplingMethod


@dataclass(eq=False)
class RoleBegin(Expr):
    role: str


@dataclass(eq=False)
class RoleEnd(Expr):
    role: str


@dataclass(eq=False)
class Image(Expr):
    path: object


@dataclass(eq=False)
class Video(Expr):
    path: object
    num_frames: int


@dataclass(eq=False)
class VarScopeBegin(Expr):
    name: str


@dataclass(eq=False)
class VarScopeEnd(Expr):
    name: str


@dataclass(eq=False)
class SeparateReasoning(Expr):
    """Split the reasoning out of the variables the expressions before it set."""

    model_type: str
    names: list[str]


@dataclass(eq=False)
class ExprList(Expr):
    exprs: list[Expr]


def to_expr(value: object) -> Expr:
    """Strings become constants; anything else that is not an expression is an error."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Constant(value)
    raise TypeError(
        f"cannot add {type(value).__name__} to a program state: expected a string or a "
        "language expression (gen, select, a role, ...)"
    )


def _flatten(expr: Expr) -> list[Expr]:
    if isinstance(expr, ExprList):
        return [e for sub in expr.exprs for e in _flatten(sub)]
    return [expr]


def flatten(expr: Expr) -> list[Expr]:
    """The leaf expressions of `expr`, in execution order."""
    return _flatten(expr)


class RoleWriter(ABC):
    """The state methods that write structure, for anything that takes expressions with
    `+=` (the program state and the tracer's): `s.user(x)` appends `x` between the role's
    begin and end; `with s.user():` does the same for everything appended in the block;
    `with s.var_scope("v"):` stores the text appended in the block as variable `v`."""

    @abstractmethod
    def __iadd__(self, other: object) -> Self: ...

    def system(self, expr: object = None) -> Any:
        return self._role("system", expr)

    def user(self, expr: object = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: object = None) -> Any:
        return self._role("assistant", expr)

    def _role(self, role: str, expr: object) -> Any:
        if expr is None:
            return self._scope(RoleBegin(role), RoleEnd(role))
        written = ExprList([RoleBegin(role), to_expr(expr), RoleEnd(role)])
        self += written
        return written

    def var_scope(self, name: str) -> Any:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name: a variable name must be a non-empty string, got {name!r}")
        return self._scope(VarScopeBegin(name), VarScopeEnd(name))

    @contextmanager
    def _scope(self, begin: Expr, end: Expr) -> Iterator[None]:
        self += begin
        yield
        self += end

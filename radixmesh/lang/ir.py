"""The language's expressions: what `s += ...` appends to a program state.

Expressions are plain data. The interpreter executes them against a backend; the tracer
records them into a graph. Adding expressions (or strings) builds an `ExprList`, so
`s += "Q: " + sgl.gen("a")` is one append of two expressions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from radixmesh.lang.choices import ChoicesSamplingMethod


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
    """`s.system(x)`, `s.user(x)`, `s.assistant(x)`: `x` between the role's begin and end,
    for anything that takes expressions with `+=` (the program state and the tracer's)."""

    @abstractmethod
    def __iadd__(self, other: object) -> Self: ...

    def system(self, expr: object = None) -> None:
        self._role("system", expr)

    def user(self, expr: object = None) -> None:
        self._role("user", expr)

    def assistant(self, expr: object = None) -> None:
        self._role("assistant", expr)

    def _role(self, role: str, expr: object) -> None:
        self += RoleBegin(role)
        if expr is not None:
            self += expr
        self += RoleEnd(role)

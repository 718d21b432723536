"""The package's modules import one another in one direction: no cycles inside radixmesh/,
nor inside bench/ (the benchmarks' modules, a package of their own).

Every import counts, wherever it stands: at module level, inside a function (a lazy
import still ties the two modules together) and under `if TYPE_CHECKING:` (a cycle of
types is a cycle of concepts). `import a.b` and `from a import b` (b a module) name the
module a.b; `from a.b import name` names a.b.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import bench
import radixmesh

ROOT = Path(radixmesh.__file__).parent
PACKAGE = ROOT.name
GENERATED = f"{PACKAGE}.v1"  # the protobuf stubs (`make proto`)
BENCH = Path(bench.__file__).parent


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    found = {module_name(p, root): p for p in root.rglob("*.py")}
    return {m: p for m, p in found.items() if not m.startswith(GENERATED)}


def imported(name: str, path: Path, known: set[str], package: str = PACKAGE) -> Iterator[str]:
    """The package's modules that `name` (at `path`) imports, anywhere in its source."""
    parent = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = parent.split(".")[: len(parent.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            # `from a import b`: the module a.b when there is one, else a (b is a name in it)
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith(package + "."):
                yield target


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    mods = modules(root)
    known = set(mods)
    return {name: set(imported(name, path, known, root.name)) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _describe(component: frozenset[str], edges: dict[str, set[str]]) -> str:
    arrows = [f"{a} -> {b}" for a in sorted(component) for b in sorted(edges[a] & component)]
    return "; ".join(arrows)


def test_the_graph_sees_imports_of_every_kind() -> None:
    edges = graph()
    # Module level, a relative import, inside a function, under TYPE_CHECKING:
    assert "radixmesh.worker.scheduler" in edges["radixmesh.worker.worker"]
    assert "radixmesh.client.types" in edges["radixmesh.client.convert"]
    assert "radixmesh.worker.engine" in edges["radixmesh.worker.engine_process"]
    assert "radixmesh.worker.cuda_graph" in edges["radixmesh.worker.model_runner"]


def test_cycles_are_found() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(edges) == [frozenset({"a", "b", "c"})]


def test_no_import_cycles_inside_the_package() -> None:
    edges = graph()
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(_describe(c, edges) for c in found)


def test_no_import_cycles_inside_the_benchmarks() -> None:
    edges = graph(BENCH)
    assert "bench.anatomy.timer" in edges["bench.anatomy.recorder"]  # the graph sees bench/
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(_describe(c, edges) for c in found)

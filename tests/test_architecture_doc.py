"""docs/architecture.md names only what exists, and every package of radixmesh/.

What the document cites is checked against the tree as it is:

- backticked repository paths: `router/dispatch.py` and `worker/kvcache/` relative to
  radixmesh/; `radixmesh/...`, `docs/...`, `bench/...`, `tests/...` (and the other
  top-level folders) relative to the repository root; `tests/x.py::test_name` names a test
  function in that file; a bare `name.md` is a page of docs/ or the root;
- `file.py` paths inside the diagram's code block, resolved the same way;
- backticked modules, `radixmesh.x.y`: a module or package, or a module and a name it
  defines, imports or lists in `__all__`;
- a backticked file followed by backticked names (`router/control.py`
  `ControlPlane.pick`, `Sink.get`): each name is defined in that file (a top-level
  definition or assignment, a member of one of its classes; `Class.member` exactly);
- Markdown links to other pages resolve.

Decisions: the code is read as syntax trees and the document as text, nothing is imported,
so the check costs milliseconds and no heavy module (torch) loads. Backticked text that
is not a path, a module or a name after a file (`asyncio.to_thread`, `radixmesh launch`,
`/v1/models`) is prose and is not checked.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "radixmesh"
DOC = REPO / "docs" / "architecture.md"
# Top-level folders a path may start with; any other path is relative to radixmesh/.
ROOT_DIRS = ("radixmesh", "docs", "bench", "tests", "proto", "deploy", "examples")

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_SPAN = re.compile(r"`([^`]+)`")
_PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)*/?(?:::\w+)?")
_MODULE = re.compile(r"radixmesh(?:\.\w+)+")
_NAME = r"[A-Za-z_]\w*(?:\.\w+)?"
_FILE_THEN_NAMES = re.compile(rf"`([\w./-]+\.py)`((?:[\s(,]*`{_NAME}`)+)")
_CODE_PATH = re.compile(r"(?<![\w./-])(?:radixmesh/[\w/.-]*|[\w-]+(?:/[\w-]+)*\.py)\b/?")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _text() -> str:
    return DOC.read_text()


def _prose(text: str) -> str:
    return _FENCE.sub("", text)


def _spans(text: str) -> list[str]:
    return [" ".join(s.split()) for s in _SPAN.findall(_prose(text))]


def resolve(path: str) -> Path:
    """Where a path of the document points (relative to the root or to radixmesh/)."""
    path = path.split("::")[0].rstrip("/")
    first = path.split("/")[0]
    if "/" not in path and path.endswith(".md"):
        in_docs = REPO / "docs" / path
        return in_docs if in_docs.exists() else REPO / path
    return REPO / path if first in ROOT_DIRS else PACKAGE / path


def is_path(span: str) -> bool:
    return (
        _PATH.fullmatch(span) is not None
        and not span.startswith("/")
        and ("/" in span or span.endswith((".py", ".md")))
    )


def module_path(name: str) -> Path | None:
    """The file of module `name`, or None when it is not a module of the package."""
    base = REPO.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _targets(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    return []


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """The module's statements, those under a top-level `if` (TYPE_CHECKING) included."""
    found: list[ast.stmt] = []
    for node in tree.body:
        found.append(node)
        if isinstance(node, ast.If):
            found += node.body + node.orelse
    return found


def defined(path: Path, name: str) -> bool:
    """Whether `name` (or `Class.member`) is defined in the file at `path`."""
    statements = _top_level(_tree(path))
    classes = {n.name: n for n in statements if isinstance(n, ast.ClassDef)}
    if "." in name:
        owner, member = name.split(".", 1)
        cls = classes.get(owner)
        return cls is not None and any(member in _targets(n) for n in cls.body)
    if any(name in _targets(n) for n in statements):
        return True
    return any(name in _targets(n) for cls in classes.values() for n in cls.body)


def exported(path: Path, name: str) -> bool:
    """Whether the module at `path` defines, imports or lists `name` in `__all__`."""
    if defined(path, name):
        return True
    for node in _tree(path).body:
        if (
            isinstance(node, ast.Assign)
            and "__all__" in _targets(node)
            and isinstance(node.value, ast.List | ast.Tuple)
        ):
            listed = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
            return name in listed
    return False


def module_exists(dotted: str) -> bool:
    if module_path(dotted) is not None:
        return True
    module, _, name = dotted.rpartition(".")
    path = module_path(module)
    return path is not None and exported(path, name)


def cited_paths(text: str) -> list[str]:
    paths = [s for s in _spans(text) if is_path(s)]
    for block in _FENCE.findall(text):
        paths += _CODE_PATH.findall(block)
    return paths


def file_names(text: str) -> list[tuple[str, str]]:
    """(file, name) for each backticked name that follows a backticked file."""
    prose = " ".join(_prose(text).split())
    pairs = []
    for file, names in _FILE_THEN_NAMES.findall(prose):
        for name in re.findall(rf"`({_NAME})`", names):
            if not name.endswith((".py", ".md")):
                pairs.append((file, name))
    return pairs


def packages() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.rglob("__init__.py") if "__pycache__" not in p.parts)


# ---- the checker's own parts ----------------------------------------------------------------


def test_paths_resolve_against_the_root_or_the_package() -> None:
    assert resolve("router/dispatch.py") == PACKAGE / "router" / "dispatch.py"
    assert resolve("worker/kvcache/") == PACKAGE / "worker" / "kvcache"
    assert resolve("docs/overlap.md") == REPO / "docs" / "overlap.md"
    assert resolve("overlap.md") == REPO / "docs" / "overlap.md"
    assert resolve("README.md") == REPO / "README.md"
    assert resolve("tests/test_prefix.py::test_x") == REPO / "tests" / "test_prefix.py"
    assert is_path("worker/model/") and is_path("prefix.py")
    assert not is_path("/v1/models") and not is_path("asyncio.to_thread")
    assert not is_path("radixmesh launch")


def test_a_renamed_or_missing_thing_is_caught() -> None:
    text = (
        "`router/control.py` `ControlPlane.pick`, `Placement`; `router/nothing.py`\n"
        "`router/control.py` `ControlPlane.gone` and `worker/engine.py` `Nope`\n"
        "```\nworker/absent.py\n```\n"
    )
    assert ("router/control.py", "ControlPlane.pick") in file_names(text)
    assert ("router/control.py", "Placement") in file_names(text)
    control = resolve("router/control.py")
    assert defined(control, "ControlPlane.pick") and defined(control, "Placement")
    assert not defined(control, "ControlPlane.gone")
    assert not defined(resolve("worker/engine.py"), "Nope")
    missing = [p for p in cited_paths(text) if not resolve(p).exists()]
    assert missing == ["router/nothing.py", "worker/absent.py"]
    assert module_exists("radixmesh.router.dispatch") and module_exists("radixmesh.Engine")
    assert not module_exists("radixmesh.router.nothing")


# ---- the document ---------------------------------------------------------------------------


def test_every_cited_path_exists() -> None:
    paths = cited_paths(_text())
    assert len(paths) > 100  # the parser still finds them
    missing = sorted({p for p in paths if not resolve(p).exists()})
    assert not missing, f"docs/architecture.md cites paths that do not exist: {missing}"


def test_every_cited_test_function_exists() -> None:
    cited = [p for p in cited_paths(_text()) if "::" in p]
    missing = [p for p in cited if not defined(resolve(p), p.split("::")[1])]
    assert not missing, f"no such test: {missing}"


def test_every_cited_module_exists() -> None:
    modules = [s for s in _spans(_text()) if _MODULE.fullmatch(s)]
    assert modules
    missing = sorted({m for m in modules if not module_exists(m)})
    assert not missing, f"docs/architecture.md cites modules that do not exist: {missing}"


def test_every_name_cited_with_its_file_is_defined_there() -> None:
    pairs = file_names(_text())
    assert len(pairs) > 50
    missing = sorted({f"{f} {n}" for f, n in pairs if not defined(resolve(f), n)})
    assert not missing, f"docs/architecture.md cites names their files lack: {missing}"


def test_every_linked_page_exists() -> None:
    links = [link for link in _LINK.findall(_text()) if "://" not in link]
    assert links
    missing = [link for link in links if not (DOC.parent / link).exists()]
    assert not missing, f"broken links: {missing}"


@pytest.mark.parametrize("package", packages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_package_is_mentioned(package: Path) -> None:
    text = _text()
    cited = {resolve(p) for p in cited_paths(text)}
    for span in _spans(text):
        if _MODULE.fullmatch(span) and (path := module_path(span)) is not None:
            cited.add(path)
    assert any(p == package or package in p.parents for p in cited), (
        f"docs/architecture.md never mentions {package.relative_to(REPO)}/"
    )

"""The import arrows between packages go one way, and no modules import each other in a circle
(DESIGN.md section 2). Read with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "sluice"

# What each package may import from sluice (beyond itself). Shared leaf modules are allowed
# everywhere: errors, config and histogram.
SHARED = {"errors", "config", "histogram", "__init__"}
ALLOWED: dict[str, set[str]] = {
    "stomp": set(),
    "store": set(),
    "core": {"store.api"},
    "server": {"stomp", "core", "store", "auth"},
    "client": {"stomp"},
    "spark": {"client", "stomp", "store.journal.format", "store.journal.scan", "store.api"},
    "admin": {"core", "server"},
    "bench": {"stomp", "client"},
    "auth": {"core.wildcard"},
    "http": {"core", "store.api", "auth"},
    "ha": {"store.api"},
}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                # `from sluice.store.journal import format` imports the module
                # sluice.store.journal.format: judge that, not its package.
                dotted = f"{node.module}.{alias.name}"
                module_path = SRC.parent / dotted.replace(".", "/")
                is_module = module_path.with_suffix(".py").exists() or module_path.is_dir()
                found.append(dotted if is_module else node.module)
    return [name for name in found if name == "sluice" or name.startswith("sluice.")]


def _allowed(package: str, target: str) -> bool:
    parts = target.split(".")[1:]  # drop "sluice"
    if not parts or parts[0] in SHARED or parts[0] == package:
        return True
    dotted = ".".join(parts)
    return any(dotted == rule or dotted.startswith(rule + ".") for rule in ALLOWED[package])


def test_import_direction() -> None:
    violations = []
    for package in ALLOWED:
        for path in sorted((SRC / package).rglob("*.py")):
            for target in _imports(path):
                if not _allowed(package, target):
                    violations.append(f"{path.relative_to(SRC)} imports {target}")
    assert not violations, "wrong import direction:\n" + "\n".join(violations)


def test_rule_catches_a_wrong_arrow() -> None:
    assert not _allowed("stomp", "sluice.core.broker")
    assert not _allowed("core", "sluice.server.session")
    assert not _allowed("core", "sluice.store.journal.store")
    assert _allowed("core", "sluice.store.api")
    assert _allowed("server", "sluice.stomp.codec")
    assert _allowed("spark", "sluice.store.journal.format")
    assert not _allowed("spark", "sluice.store.journal.store")
    assert _allowed("http", "sluice.core.views")
    assert not _allowed("http", "sluice.server.listener")
    assert not _allowed("server", "sluice.http.app")
    assert not _allowed("core", "sluice.http.app")


# -- import circles -------------------------------------------------------------------------------
#
# Every import counts, wherever it is written: at the top, inside a function, or under
# `if TYPE_CHECKING:` (a circle the type checker sees is a circle in the design). Nodes are
# modules (a package is its `__init__`); the implicit import of a parent package is not an arrow.

# Circles being taken apart, if any: each entry must still be a circle (the test fails once it
# is broken, so that it is deleted here), and the list only shrinks. Empty: none is left.
KNOWN_CIRCLES: set[frozenset[str]] = set()


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _module_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of `root`'s package it imports."""
    modules = {_module_name(path, root): path for path in sorted(root.rglob("*.py"))}

    def known(dotted: str) -> str | None:
        # The module itself, else the closest package that holds the name.
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                for alias in node.names:
                    # `from pkg import mod` imports the module; `from mod import name` its module.
                    dotted = f"{module}.{alias.name}"
                    targets.add(dotted if dotted in modules else known(module))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def _describe(circles: set[frozenset[str]]) -> str:
    return "\n".join(" <-> ".join(sorted(circle)) for circle in sorted(circles, key=sorted))


def test_no_import_circles() -> None:
    circles = _circles(_module_graph(SRC))
    new = circles - KNOWN_CIRCLES
    assert not new, "import circles:\n" + _describe(new)
    gone = KNOWN_CIRCLES - circles
    assert not gone, "no longer circles, delete them from KNOWN_CIRCLES:\n" + _describe(gone)


def test_circle_check_catches_a_planted_circle(tmp_path: Path) -> None:
    root = tmp_path / "planted"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "top.py").write_text("import planted.sub.a\n")
    (root / "sub" / "a.py").write_text("from planted.sub import b\n")
    # Hidden from the interpreter, not from the check.
    (root / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n"
    )
    (root / "sub" / "c.py").write_text("def f():\n    from planted.sub.a import x\n")
    (root / "leaf.py").write_text("from planted.top import y\n")
    graph = _module_graph(root)
    assert graph["planted.sub.b"] == {"planted.sub.c"}
    assert _circles(graph) == {frozenset({"planted.sub.a", "planted.sub.b", "planted.sub.c"})}
    # Two top-level modules that import each other are a circle too.
    (root / "top.py").write_text("import planted.leaf\n")
    assert frozenset({"planted.top", "planted.leaf"}) in _circles(_module_graph(root))

"""The import arrows between packages go one way (DESIGN.md section 2). Read with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "sluice"

# What each package may import from sluice (beyond itself). Shared leaf modules are allowed
# everywhere: errors and config.
SHARED = {"errors", "config", "__init__"}
ALLOWED: dict[str, set[str]] = {
    "stomp": set(),
    "store": set(),
    "core": {"store.api"},
    "server": {"stomp", "core", "store"},
    "client": {"stomp"},
    "spark": {"client", "stomp", "store.journal.format", "store.journal.scan", "store.api"},
    "admin": {"core", "server"},
    "bench": {"stomp", "client"},
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

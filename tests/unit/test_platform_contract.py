"""The platform contract is complete (issue 29): what a step needs of a node's shell or connection is
a method or attribute declared on ``Platform`` / ``Transport``, not a branch on their classes.

Checked on the source: an ``isinstance`` naming a platform or transport class, or a ``getattr`` on a
platform or transport, outside ``platforms/`` and ``transports/``: the package holds none.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import orchestrator.platforms as platforms
import orchestrator.transports as transports
from orchestrator.platforms import Platform
from orchestrator.transports import Transport

PACKAGE = Path(platforms.__file__).resolve().parents[1]
#: every part of the package but the platforms and transports themselves: not one branch
CLEAN = sorted(p.name for p in PACKAGE.iterdir() if p.name not in ("platforms", "transports", "__pycache__"))
#: names a platform or a transport goes by where a branch on it would be written
HOLDERS = {"platform", "transport", "t", "shell", "p"}


def _classes() -> set[str]:
    """Every platform and transport class of the package (each module of both packages)."""
    found = set()
    for package in (platforms, transports):
        for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            for name, value in vars(importlib.import_module(module.name)).items():
                if inspect.isclass(value) and issubclass(value, (Platform, Transport)):
                    found.add(name)
    return found


CLASSES = _classes()


def _names(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Tuple):
        return [n for item in node.elts for n in _names(item)]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return []


def _holder(node: ast.expr) -> bool:
    """``transport``, ``platform``, ``x.platform``, ``self.transport``, ..."""
    if isinstance(node, ast.Name):
        return node.id in HOLDERS
    return isinstance(node, ast.Attribute) and node.attr in ("platform", "transport", "host_shell")


def branches(source: str) -> list[tuple[int, str]]:
    """Where ``source`` branches on a platform's or a transport's class, or probes one with getattr."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2):
            continue
        if node.func.id == "isinstance" and CLASSES.intersection(_names(node.args[1])):
            found.append((node.lineno, "isinstance " + "/".join(_names(node.args[1]))))
        elif node.func.id in ("getattr", "hasattr") and _holder(node.args[0]):
            found.append((node.lineno, f"{node.func.id} on a platform or transport"))
    return found


def _found(where: str) -> dict[str, list[tuple[int, str]]]:
    root = PACKAGE / where
    files = [root] if root.suffix == ".py" else sorted(root.rglob("*.py"))
    return {
        str(path.relative_to(PACKAGE)): hits
        for path in files
        if (hits := branches(path.read_text(encoding="utf-8")))
    }


def test_the_checker_finds_each_kind_of_branch() -> None:
    assert {"PosixShell", "PowerShell", "WslShell", "Platform", "Transport"} <= CLASSES
    source = (
        "if isinstance(transport.platform, (PosixShell, PowerShell)):\n    pass\n"
        "run = getattr(transport, 'run_windows', None)\n"
        "ok = isinstance(value, dict)\n"
    )
    assert branches(source) == [
        (1, "isinstance PosixShell/PowerShell"),
        (3, "getattr on a platform or transport"),
    ]


def test_nothing_outside_the_platforms_asks_a_platform_its_class() -> None:
    assert {"steps", "runs", "cli", "facts", "slurm", "pipeline.py", "render.py"} <= set(CLEAN)
    offenders = {path: hits for where in CLEAN for path, hits in _found(where).items()}
    assert offenders == {}, f"declare what they need on Platform / Transport: {offenders}"

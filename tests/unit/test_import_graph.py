"""The import graph of ``orchestrator/`` has one direction (docs/design.md, issue 13).

Built from the source with ``ast``: every ``import`` and ``from ... import`` counts, at module level
and inside functions alike (a function-level import is still a dependency, only a later one).
Imports under ``if TYPE_CHECKING:`` are left out: they never run, and annotations may point
anywhere. ``from a.b import c`` depends on ``a.b`` (its ``__init__`` runs first), and on the module
``a.b.c`` when there is one.

Rules:
- no import cycle, except the ones listed in ``ALLOWED_CYCLES`` (inside ``orchestrator.cli`` only,
  being removed: delete an entry once its cycle is gone, the test says when);
- nothing outside ``orchestrator.cli`` imports ``orchestrator.cli``: the CLI sits on top (only the
  entry point ``orchestrator.__main__``, `python -m orchestrator`, starts it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"

#: what starts the CLI: above it, not below
ENTRY_POINTS = {"orchestrator.__main__"}
#: cycles that exist today, each inside orchestrator.cli (strongly connected components, by module)
ALLOWED_CYCLES: set[frozenset[str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, skipping the bodies of ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    """module -> the orchestrator modules it imports."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    # relative: from the module's package (a package's own __init__ is its package)
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                # ``from package import submodule`` needs the submodule and the package too (Python
                # runs the package's __init__ first: what it imports, even inside a function, is
                # imported before the submodule can be); a name needs its module
                targets = [base, *(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in files)]
            for target in targets:
                if target in files and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def _describe(component: frozenset[str], graph: dict[str, set[str]]) -> str:
    edges = sorted(f"{a} -> {b}" for a in component for b in graph[a] if b in component)
    return "{" + ", ".join(sorted(component)) + "}: " + "; ".join(edges)


def test_the_graph_sees_module_and_function_level_imports() -> None:
    graph = import_graph()
    # module level: the preflight's checks decide on facts
    assert "orchestrator.facts.linux" in graph["orchestrator.steps.preflight.checks"]
    # function level only: the firewall borrows the preflight's interface judgement when it runs
    assert "orchestrator.steps.preflight" in graph["orchestrator.steps.firewall"]
    # type-only imports are not dependencies
    assert "orchestrator.session" not in graph["orchestrator.steps.preflight"] or any(
        "orchestrator.session" in line
        for line in (PACKAGE / "steps" / "preflight" / "__init__.py").read_text().splitlines()
        if line.startswith(("from orchestrator.session", "import orchestrator.session"))
    )


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]


def test_no_import_cycles_outside_the_allowed_cli_ones() -> None:
    graph = import_graph()
    found = set(cycles(graph))
    for allowed in ALLOWED_CYCLES:
        assert all(m.startswith("orchestrator.cli") for m in allowed), "only cli cycles may be allowed"
    new = [c for c in found if c not in ALLOWED_CYCLES]
    assert not new, "import cycles:\n" + "\n".join(_describe(c, graph) for c in new)
    gone = [c for c in ALLOWED_CYCLES if c not in found]
    assert not gone, "no longer a cycle, remove from ALLOWED_CYCLES: " + "; ".join(
        ", ".join(sorted(c)) for c in gone
    )


def test_only_the_cli_imports_the_cli() -> None:
    graph = import_graph()
    offenders = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if not (
            module in ENTRY_POINTS or module == "orchestrator.cli" or module.startswith("orchestrator.cli.")
        )
        for target in targets
        if target == "orchestrator.cli" or target.startswith("orchestrator.cli.")
    )
    assert not offenders, "\n".join(offenders)


def test_a_command_that_reaches_no_ssh_node_does_not_load_the_ssh_stack() -> None:
    """paramiko, cryptography and fabric cost about 0.15 s of CPU to import: `bootstrap --help`, the
    inventory and every command on local or WinRM nodes start without them."""
    import subprocess
    import sys

    inventory = PACKAGE.parent / "inventory" / "local.yaml"
    code = (
        "import sys\n"
        "from orchestrator.cli.main import main\n"
        f"sys.argv = ['bootstrap', '-i', {str(inventory)!r}, 'inventory']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('paramiko', 'fabric', 'invoke') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout

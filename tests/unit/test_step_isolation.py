"""A step cannot touch a transport, a session or the terminal (orchestrator/steps/contract.py).

Its methods get a node, its read values and its plan's results: the runner alone reaches nodes. What
keeps that true is checked here on the source of every ``Step`` subclass in the package: its body
names no transport, session or executor (no parameter, attribute, annotation or call of one), creates
none (no name imported from ``orchestrator.transports`` / ``orchestrator.session``), and writes to no
terminal (``print``, ``input``, ``sys.stdout``, a rich ``Console``). A step that needs a node's state
asks for a read; one that must change a node returns a plan.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"

#: names a step's body may not hold, whatever their spelling's case
REACHING = {"transport", "transports", "session", "executor", "connect", "open_session"}
TERMINAL = {"print", "input", "Console", "ui"}
#: modules whose names, imported, reach nodes
NODE_MODULES = ("orchestrator.transports", "orchestrator.session", "orchestrator.executor")


def _is_step(cls: ast.ClassDef) -> bool:
    for base in cls.bases:
        named = base.value if isinstance(base, ast.Subscript) else base
        if isinstance(named, ast.Name) and named.id == "Step":
            return True
    return False


def _imported_from_node_modules(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(NODE_MODULES):
            names |= {alias.asname or alias.name for alias in node.names}
    # plain results (what a plan's command gave, a group's outcomes): no way to a node
    return names - {"Result", "GroupResult", "Outcome"}


def offences(source: str) -> list[str]:
    """``Class.line: name`` for every way a Step subclass in ``source`` reaches a node or a terminal."""
    tree = ast.parse(source)
    forbidden = _imported_from_node_modules(tree)
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and _is_step(n)):
        for node in ast.walk(cls):
            if isinstance(node, ast.Name):
                name = node.id
            elif isinstance(node, ast.Attribute):
                name = node.attr
                on_sys = isinstance(node.value, ast.Name) and node.value.id == "sys"
                if on_sys and name in ("stdout", "stderr"):
                    name = "print"  # a result's .stdout is its own; sys's is the terminal
            elif isinstance(node, ast.arg):
                name = node.arg
            else:
                continue
            if name.lower() in REACHING or name in TERMINAL or name in forbidden:
                found.append(f"{cls.name}.{node.lineno}: {name}")
    return found


def steps_in_package() -> dict[Path, list[str]]:
    """Each module of the package that defines Step subclasses: their names."""
    found: dict[Path, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and _is_step(n)]
        if names:
            found[path] = names
    return found


def test_the_checker_finds_each_way_a_step_could_reach_a_node() -> None:
    source = """
from orchestrator.transports import SSHTransport
from orchestrator.session import Session
class Given(Step[None, V]):
    def plan(self, node, values, transport): ...
class Kept(Step[None, V]):
    def __init__(self, session: Session): self.s = session
class Made(Step[None, V]):
    def judge(self, node, plan, results): return SSHTransport(node).run("id")
class Talks(Step[None, V]):
    def judge(self, node, plan, results): print("done")
class Writes(Step[None, V]):
    def judge(self, node, plan, results): sys.stderr.write(results[0].stderr)
class Fine(Step[None, V]):
    def plan(self, node, values): return NodePlan(node.name)
class NotAStep:
    def run(self, transport): print(transport)
"""
    said = offences(source)
    assert {line.split(".")[0] for line in said} == {"Given", "Kept", "Made", "Talks", "Writes"}, said
    assert "Made.9: SSHTransport" in said and "Talks.11: print" in said, said


def test_no_step_reaches_a_node_or_the_terminal_itself() -> None:
    steps = steps_in_package()
    # the steps on the contract today (a new one joins this list by being written as a Step)
    named = {name for names in steps.values() for name in names}
    assert {"Firewall", "Preflight", "Clean", "ConfigureTime", "InstallChrony", "RestoreTime"} <= named
    found = {str(path.relative_to(PACKAGE)): offences(path.read_text(encoding="utf-8")) for path in steps}
    assert {path: said for path, said in found.items() if said} == {}


#: the modules of steps/ that are handed a transport today: work not yet written as a Step (launch's
#: start, the code and env syncs' own rounds, the preflight's listener and clock samples, keys, root,
#: remote). The list may only shrink: a step written since reaches its nodes through the runner.
HANDED_A_TRANSPORT = {
    "steps/codesync/sync.py",
    "steps/envsync/__init__.py",
    "steps/envsync/build.py",
    "steps/envsync/master.py",
    "steps/envsync/probe.py",
    "steps/keys.py",
    "steps/launch.py",
    "steps/node_facts.py",
    "steps/preflight/__init__.py",
    "steps/preflight/early.py",
    "steps/preflight/reachability.py",
    "steps/preflight/rounds.py",
    "steps/preflight/shared_fs.py",
    "steps/remote.py",
    "steps/root.py",
}


def handed_a_transport(source: str) -> bool:
    """Whether a function or method in ``source`` takes a parameter annotated as a Transport."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.arg) and node.annotation is not None:
            text = ast.unparse(node.annotation).strip("'\"")
            if text.split(".")[-1].split("[")[0].split(" ")[0] == "Transport":
                return True
    return False


def test_the_transport_checker_sees_a_parameter_in_each_spelling() -> None:
    assert handed_a_transport("def f(t: Transport) -> None: ...")
    assert handed_a_transport("def f(t: 'Transport') -> None: ...")
    assert handed_a_transport("class A:\n    def f(self, *, t: transports.Transport | None): ...")
    assert not handed_a_transport("def f(t: TransportError, r: Result) -> None: ...")


def test_no_new_module_of_steps_is_handed_a_transport() -> None:
    handed = {
        str(path.relative_to(PACKAGE))
        for path in sorted((PACKAGE / "steps").rglob("*.py"))
        if handed_a_transport(path.read_text(encoding="utf-8"))
    }
    assert handed - HANDED_A_TRANSPORT == set(), (
        "a step that reaches its nodes itself: write it as a Step (reads, plan, judge), whose plans "
        "the runner applies (docs/design.md)"
    )
    assert HANDED_A_TRANSPORT - handed == set(), "no longer handed one: take it off the list"

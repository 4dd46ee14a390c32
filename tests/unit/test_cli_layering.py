"""The CLI parses options and renders reports; steps talk to nodes (docs/design.md, issue 29).

Checked on the source of ``orchestrator/cli/``: no command is sent to a node from there (no
``run``/``put``/``get`` on a transport), so what a command does on a node is always in a step, where
its dry-run and its tests find it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ExitCode, Terminated

CLI = Path(__file__).resolve().parents[2] / "orchestrator" / "cli"

#: what moves commands or files to or from a node
NODE_CALLS = {"run", "put", "get", "download", "run_windows", "run_script"}


def _node_calls(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in NODE_CALLS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in ("transport", "t")
        ):
            found.append((node.lineno, f"{node.func.value.id}.{node.func.attr}"))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in ("transport", "t")
        ):
            found.append((node.lineno, "getattr on a transport"))
    return found


def test_the_checker_finds_a_transport_call() -> None:
    assert _node_calls("def one(node, transport):\n    return transport.run('ls')\n") == [
        (2, "transport.run")
    ]
    assert _node_calls("x = getattr(t, 'run_windows', None)\n") == [(1, "getattr on a transport")]


def test_no_cli_module_talks_to_a_node_itself() -> None:
    offenders = {
        path.name: calls for path in sorted(CLI.glob("*.py")) if (calls := _node_calls(path.read_text()))
    }
    assert offenders == {}, f"move these into a step (orchestrator/steps/): {offenders}"


def test_the_pipeline_refuses_an_inventory_once(tmp_path: Path, monkeypatch: Any) -> None:
    """What makes a whole inventory unusable (native Windows beside Linux nodes) is decided once per
    run, before anything connects: not again by each phase the pipeline runs."""
    from click.testing import CliRunner

    from orchestrator.cli.main import cli
    from orchestrator.steps.preflight import checks

    calls: list[str] = []
    real = checks.refuse_native_mix

    def counted(inventory: Any) -> None:
        calls.append(inventory.cluster.name)
        real(inventory)

    monkeypatch.setattr(checks, "refuse_native_mix", counted)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["--dry-run"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "launch (dry run)" in result.output  # every phase ran (printed its plan)
    assert len(calls) == 1


#: where a node's work starts: a session fanning a function out, or a node's transport in hand
SESSION_CALLS = {"map", "transport", "reopened"}
#: what builds the text a node's shell runs (orchestrator/platforms/ builds it, steps ask for it)
SHELL_BUILDERS = {"PosixShell", "PowerShell", "WslShell", "wrap", "ensure_authorized_key"}
#: none left: every module of cli/ hands a session to orchestrator/ and renders what comes back
NOT_YET: dict[str, set[str]] = {}
#: lines of orchestrator/cli/ today (issue 29's goal: 2,500): lower it as code leaves, never raise it
CLI_LINE_BUDGET = 3051  # a ratchet toward issue 29's 2,500: lower it as cli/ shrinks


def _node_work(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.For, ast.comprehension)):
            it = node.iter
            if (
                isinstance(it, ast.Attribute)
                and it.attr == "nodes"
                and isinstance(it.value, ast.Name)
                and it.value.id in ("session", "on", "fresh", "shared")
            ):
                found.append((getattr(it, "lineno", 0), f"loop over {it.value.id}.nodes"))
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            if (
                isinstance(func, ast.Attribute)
                and name in SESSION_CALLS
                and isinstance(func.value, ast.Name)
                and (func.value.id in ("session", "on", "fresh", "shared") or name == "transport")
            ):  # a node's transport in hand, whatever the session is called
                found.append((node.lineno, f"session.{name}"))
            if name in SHELL_BUILDERS:
                found.append((node.lineno, f"shell text: {name}"))
    return found


def test_the_checker_finds_node_work() -> None:
    source = (
        "def f(session, platform):\n"
        "    for n in session.nodes:\n"
        "        pass\n"
        "    session.map(lambda n, t: 1)\n"
        "    login.transport(n)\n"
        "    return platform.wrap('ls')\n"
    )
    assert _node_work(source) == [
        (2, "loop over session.nodes"),
        (4, "session.map"),
        (5, "session.transport"),
        (6, "shell text: wrap"),
    ]


def test_no_cli_module_loops_over_nodes_or_builds_shell_text() -> None:
    offenders = {}
    for path in sorted(CLI.glob("*.py")):
        found = [
            (line, what)
            for line, what in _node_work(path.read_text())
            if what not in NOT_YET.get(path.name, ())
        ]
        if found:
            offenders[path.name] = found
    assert offenders == {}, f"move these into a step (orchestrator/steps/) or runs/: {offenders}"


def test_the_cli_stays_within_its_line_budget() -> None:
    lines = sum(len(path.read_text().splitlines()) for path in CLI.glob("*.py"))
    assert lines <= CLI_LINE_BUDGET, f"orchestrator/cli/ has {lines} lines (budget {CLI_LINE_BUDGET})"


#: none left: every command's --json and dry run go through cli/report.py
OWN_RENDERING: dict[str, set[str]] = {}


def _own_rendering(source: str) -> list[tuple[int, str]]:
    """A ``--json`` document with a ``"nodes"`` list built here rather than by cli/report.py (one shape
    for every command), or a dry run's ``would run``/``would upload`` printed here rather than by its
    one printer (cli/report.py ``plan_lines``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict) and any(
            isinstance(k, ast.Constant) and k.value == "nodes" for k in node.keys
        ):
            found.append((node.lineno, "nodes"))
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(node.lineno, w) for w in ("would run", "would upload") if w in node.value]
        if isinstance(node, ast.JoinedStr):
            text = "".join(
                v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
            )
            found += [(node.lineno, w) for w in ("would run", "would upload") if w in text]
    return sorted(set(found))


def test_the_checker_finds_own_renderings() -> None:
    source = 'doc = {"command": "x", "nodes": []}\nui.print_text(f"# {name}: would run:")\n'
    assert _own_rendering(source) == [(1, "nodes"), (2, "would run")]


def test_every_command_renders_its_report_through_one_module() -> None:
    offenders = {}
    for path in sorted(CLI.glob("*.py")):
        if path.name == "report.py":
            continue
        found = [
            (line, what)
            for line, what in _own_rendering(path.read_text())
            if what not in OWN_RENDERING.get(path.name, ())
        ]
        if found:
            offenders[path.name] = found
    assert offenders == {}, f"render these through cli/report.py (json_doc, show_dry_run): {offenders}"


def test_every_table_is_a_view_drawn_by_one_function() -> None:
    """A command's table is a ``View`` its report builds (orchestrator/view.py), drawn by
    cli/report.py: no other cli module builds a rich Table (cli/ui.py's progress board aside)."""
    offenders = [
        f"{path.name}:{node.lineno}"
        for path in sorted(CLI.glob("*.py"))
        if path.name not in ("report.py", "ui.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) == "Table" or getattr(node.func, "attr", None) == "add_row")
    ]
    assert offenders == [], f"build a View beside the report's data, draw it with cli/report.py: {offenders}"


@pytest.mark.parametrize(
    ("command", "where"),
    [
        (["firewall"], "orchestrator.steps.firewall.apply_firewall"),
        (["ntp"], "orchestrator.steps.timesync.sync_time"),
        (["check"], "orchestrator.steps.preflight.run_preflight"),
    ],
)
@pytest.mark.parametrize("stop", [KeyboardInterrupt, Terminated], ids=["ctrl-c", "sigterm"])
def test_a_stop_while_a_command_works_on_its_nodes_ends_it_as_any_other(
    command: list[str], where: str, stop: type[BaseException], tmp_path: Path, monkeypatch: Any
) -> None:
    """Ctrl-C (or SIGTERM) while firewall, ntp or check work on the nodes: the command says it was
    interrupted (what that stopped), exits 130 (143), and prints no report: the CLI's one exit path,
    the same for every command and for the main pipeline's phases."""
    from click.testing import CliRunner

    from orchestrator.cli.main import cli

    def stopped(*args: Any, **kwargs: Any) -> None:
        raise stop()

    monkeypatch.setattr(where, stopped)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, command, catch_exceptions=False)
    code = ExitCode.TERMINATED if stop is Terminated else ExitCode.INTERRUPTED
    what = "terminated (SIGTERM)" if stop is Terminated else "interrupted"
    assert result.exit_code == code, result.output
    assert f"{what}: connections closed, commands still running on the nodes were stopped" in result.output
    assert "cluster" not in result.stdout  # no table


@pytest.mark.parametrize("stop", [KeyboardInterrupt, Terminated], ids=["ctrl-c", "sigterm"])
def test_a_stop_before_logs_reads_says_the_run_goes_on(
    stop: type[BaseException], tmp_path: Path, monkeypatch: Any
) -> None:
    """Ctrl-C while `logs --follow` still connects (before any line was read): it only reads, so it
    says the run goes on and how to stop it, never that it stopped commands on the nodes."""
    from click.testing import CliRunner

    from orchestrator.cli.main import cli

    def stopped(*args: Any, **kwargs: Any) -> None:
        raise stop()

    monkeypatch.setattr("orchestrator.cli.runs._logs", stopped)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["logs", "--run", "r-1", "--follow"], catch_exceptions=False)
    code = ExitCode.TERMINATED if stop is Terminated else ExitCode.INTERRUPTED
    assert result.exit_code == code, result.output
    assert "the run goes on; stop it with: bootstrap stop --run r-1" in result.output, result.output
    assert "commands still running on the nodes were stopped" not in result.output

"""The CLI parses options and renders reports; steps talk to nodes (docs/design.md, issue 29).

Checked on the source of ``orchestrator/cli/``: no command is sent to a node from there (no
``run``/``put``/``get`` on a transport), so what a command does on a node is always in a step, where
its dry-run and its tests find it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

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

"""The main pipeline's exit code from its phases' codes (docs/cli.md, exit codes).

The phases are stand-ins: what is checked is the pipeline's own rule, which a real run shows only
with nodes made to fail in one phase and pass the next (tests/e2e cover the phases themselves).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.errors import ExitCode
from orchestrator.inventory import load_inventory_text
from orchestrator.pipeline import PipelineOptions, run_pipeline
from orchestrator.transports import SSHOptions

INVENTORY = """\
cluster: {name: lab, master: a}
nodes:
  - {name: a, host: 192.0.2.1}
  - {name: b, host: 192.0.2.2}
"""


class Phases:
    """A front end whose phases end with the given codes (their work is not run: ``_phase`` below)."""

    def __init__(self, **codes: ExitCode) -> None:
        self.codes = codes
        self.ran: list[str] = []
        self.said: list[tuple[str, str]] = []

    def phase(self, name: str) -> ExitCode:
        self.ran.append(name)
        return self.codes.get(name, ExitCode.OK)

    def say(self, level: str, text: str) -> None:
        self.said.append((level, text))


@pytest.fixture(autouse=True)
def _no_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The root-access read and the preflight's early listeners need nodes: none here."""
    monkeypatch.setattr("orchestrator.pipeline._first_round", lambda *a, **k: {})
    monkeypatch.setattr("orchestrator.steps.preflight.privilege.refused_root", lambda *a, **k: [])
    monkeypatch.setattr("orchestrator.steps.preflight.early.end_early_rounds", lambda session: None)
    monkeypatch.setattr("orchestrator.pipeline._phase", lambda name, front, *_, **__: front.phase(name))


def _run(phases: Phases, *, dry_run: bool = False, **options: Any) -> Any:
    inventory = load_inventory_text(INVENTORY, "lab.yaml")
    if dry_run:
        options["dry_run"] = SSHOptions()
    session = SimpleNamespace(nodes=list(inventory.nodes))
    return run_pipeline(session, inventory, list(inventory.nodes), PipelineOptions(**options), phases)  # type: ignore[arg-type]


def test_a_dry_run_whose_firewall_and_time_phases_could_not_read_the_nodes_exits_3() -> None:
    phases = Phases(firewall=ExitCode.CONNECTION, ntp=ExitCode.NODES_FAILED)
    report = _run(phases, dry_run=True)
    assert phases.ran == ["firewall", "ntp", "check", "validate", "launch"]  # every plan is shown
    assert report.exit_code == ExitCode.CONNECTION  # 3 takes precedence over 1
    assert (
        "error",
        "--dry-run: the firewall and ntp phase(s) failed on some nodes (see above)",
    ) in phases.said


def test_a_real_run_goes_on_past_the_firewall_and_the_check_decides() -> None:
    phases = Phases(firewall=ExitCode.NODES_FAILED)
    assert _run(phases).exit_code == ExitCode.OK
    assert phases.ran == ["firewall", "ntp", "check", "validate", "launch"]
    stopped = Phases(firewall=ExitCode.CONNECTION, check=ExitCode.CONNECTION)
    assert _run(stopped).exit_code == ExitCode.CONNECTION and stopped.ran == ["firewall", "ntp", "check"]


def test_a_clean_dry_run_exits_0() -> None:
    phases = Phases()
    assert _run(phases, dry_run=True).exit_code == ExitCode.OK
    assert [level for level, _ in phases.said] == ["note"]  # validate: what a real run would skip


def test_the_whole_pipelines_dry_run_shows_each_phase_under_its_header(tmp_path: Path) -> None:
    import os
    import subprocess

    from tests.conftest import BOOTSTRAP

    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1"}
    argv = [
        BOOTSTRAP,
        "-i",
        str(Path(__file__).resolve().parents[2] / "inventory" / "local.yaml"),
        "--dry-run",
    ]
    run = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    headers = [line for line in run.stdout.splitlines() if line.startswith("# ======== ")]
    # one machine: no firewall, no time sync
    assert headers == [f"# ======== {p} (dry run) ========" for p in ("check", "validate", "launch")]
    assert not (tmp_path / "runs").exists()

"""One dry-run printer and one ``--json`` shape for every command (cli/report.py, issue 29).

Whatever a command's dry run is built from (a runner step's plans, steps/dry_run.py's one script per
node, a launch's plan), it prints the same layout: per node, in the order they are applied, each
upload and each run with the exact text the node's shell receives; its ``--json`` lists each node
with the common fields and its plan, whose runs are the texts shown."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from orchestrator.errors import RunStoppedError, UnreachableError
from orchestrator.records import unnonced
from tests.conftest import BOOTSTRAP

INVENTORY = """\
cluster: {name: lab, master: a, backend: gloo, train: {script: train.py}}
nodes:
  - {name: a, host: 198.18.9.11, user: root}
  - {name: b, host: 198.18.9.12, user: trainer}
"""

#: the head of every section of every dry run: node, how it is reached, what would happen
HEAD = re.compile(r"^# ---- (a|b) \(ssh (root|trainer)@198\.18\.9\.1[12]\): would (run|upload) ", re.M)


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "BOOTSTRAP_INVENTORY"}
    env.update({"NO_COLOR": "1", "HOME": str(tmp_path)})
    return subprocess.run(
        [BOOTSTRAP, "-i", str(tmp_path / "lab.yaml"), "--dry-run", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _same(text: str) -> str:
    """``text`` comparable across two dry runs: each chooses its own nonces and validate's run id."""
    return re.sub(r"validate-lab-[0-9-]+", "validate-lab-ID", unnonced([text])[0])


def test_every_commands_dry_run_has_one_layout_and_its_json_the_texts_shown(tmp_path: Path) -> None:
    (tmp_path / "lab.yaml").write_text(INVENTORY)
    (tmp_path / "train.py").write_text("print('hi')\n")
    for command in (
        ["status", "--run", "lab-1"],
        ["run", "--become", "--", "echo $HOSTNAME"],
        ["launch", "--run-id", "lab-1"],
        ["validate"],
    ):
        text = _cli(tmp_path, *command)
        assert text.returncode == 0, (command, text.stderr)
        sections = [line for line in text.stdout.splitlines() if line.startswith("# ---- ")]
        assert sections, (command, text.stdout)
        assert all(HEAD.match(line) for line in sections), (command, sections)
        doc = json.loads(_cli(tmp_path, "--json", *command).stdout)
        assert doc["command"] == command[0] and doc["dry_run"] is True and doc["exit_code"] == 0, doc
        for node in doc["nodes"]:
            assert (node["ok"], node["error"]) == (True, None)
            runs = [a["run"] for a in node["plan"]["actions"] if "run" in a]
            assert len(runs) == len(node.get("prepare", [])) + len(node["commands"])
            for sent in [*node.get("prepare", []), *node["commands"]]:
                assert _same(sent) in _same(text.stdout)  # what the text shows is what the shell gets
    run = _cli(tmp_path, "run", "--become", "--", "echo $HOSTNAME").stdout
    assert run.count("would run as root:") == 2  # as whom it runs, in the head
    launch = _cli(tmp_path, "launch", "--run-id", "lab-1").stdout
    # the plan in the order it is applied: the preparation, the launch script (masked), the launcher
    order = [
        m.group(0) for m in re.finditer(r"# ---- a \(ssh root@198\.18\.9\.11\): would \w+ [^\n]*", launch)
    ]
    assert "refuse a run id used before" in order[0]
    assert "/launch.sh (launch script," in order[1] and "sha256 " in order[1]
    assert order[-1].endswith("would run as the login user (the launcher):")


def test_a_table_cell_names_the_error_by_what_it_is() -> None:
    from orchestrator.executor import Outcome
    from orchestrator.view import node_view

    class NoRoute(UnreachableError):  # a narrower kind of an unreachable node
        pass

    failed = [
        Outcome("a", None, NoRoute("no route to host", node="a"), 1.0),
        Outcome("b", None, RunStoppedError("stopped by stop --run", node="b"), 1.0),
    ]
    view = node_view("t", ("node", "result"), failed, lambda v: [v])
    assert [(cells[0], cells[1].text) for cells, _ in view.rows] == [("a", "unreachable"), ("b", "stopped")]


def test_a_commands_own_value_named_like_a_parameter_is_a_value_in_its_json(capsys: object) -> None:
    """validate's ``--json`` carries ``ok`` (did every rank join) beside its nodes: that value went
    into ``json_doc``'s per-node ``ok`` parameter and every ``bootstrap --json`` crashed at validate."""
    from orchestrator.cli.report import json_doc
    from orchestrator.cli.ui import UI
    from orchestrator.errors import ExitCode
    from orchestrator.executor import Outcome

    ui = UI(json_mode=True)
    printed: list[dict[str, object]] = []
    ui.print_json = printed.append  # type: ignore[method-assign]
    outcome: Outcome[object] = Outcome(node="a", value=None, error=None, duration=0.5)
    code = json_doc(ui, "validate", [outcome], ExitCode.OK, None, ok=True, fields=["x"], command="shadow")
    assert code == ExitCode.OK
    (doc,) = printed
    assert doc["ok"] is True and doc["fields"] == ["x"]
    assert doc["nodes"] == [{"name": "a", "ok": True, "duration": 0.5, "error": None}]


def test_a_slurm_launchs_json_lists_its_nodes_in_the_common_shape(tmp_path: Path) -> None:
    """`launch --json` on a Slurm cluster: ``nodes`` is the list every command gives (``name``,
    ``ok``, ``duration``, ``error``), each node with its own exit code; a script reading any other
    command's nodes reads these the same way."""
    from orchestrator.cli.common import Settings
    from orchestrator.cli.slurm import _summary
    from orchestrator.errors import ExitCode
    from orchestrator.slurm.run import JobEnd, NodeEnd, SlurmRun

    settings = Settings(json_mode=True)
    printed: list[dict[str, object]] = []
    settings.ui.print_json = printed.append  # type: ignore[method-assign]
    end = JobEnd("42", "FAILED", [NodeEnd("n1", 0, []), NodeEnd("n2", 3, ["boom"])], failed_first="n2")
    code = _summary(settings, SlurmRun("lab-1", "42", "/shared/lab-1"), end, tmp_path)
    (doc,) = printed
    assert code == ExitCode.NODES_FAILED and doc["exit_code"] == int(ExitCode.NODES_FAILED)
    assert (doc["command"], doc["run_id"], doc["job_id"], doc["state"]) == ("launch", "lab-1", "42", "FAILED")
    assert (doc["failed_first"], doc["time_limit_reached"], doc["log_dir"]) == ("n2", False, str(tmp_path))
    assert doc["nodes"] == [
        {"name": "n1", "ok": True, "duration": 0.0, "error": None, "exit_code": 0},
        {"name": "n2", "ok": False, "duration": 0.0, "error": None, "exit_code": 3},
    ]


def test_a_table_shows_node_text_as_it_is_and_a_failed_node_in_its_own_words(capsys: Any) -> None:
    """Every table is a View drawn by one function: a cell a node filled is its text, never rich
    markup or a terminal control; a node that failed has its error's few words, "-" elsewhere."""
    from orchestrator.cli.report import draw
    from orchestrator.cli.ui import UI
    from orchestrator.executor import Outcome
    from orchestrator.view import Cell, node_view

    outcomes = [
        Outcome("a", "[bold red]forged[/] \x1b]0;title\x07", None, 1.5),
        Outcome("b", None, UnreachableError("no route", node="b"), 2.0),
    ]
    view = node_view("demo", ("node", "said", "time"), outcomes, lambda v: [Cell(v, "green")], timed=True)
    draw(UI(color=False), view)
    shown = capsys.readouterr().out
    assert "[bold red]forged[/] ^[]0;title^G" in shown
    assert "\x1b" not in shown and "\x07" not in shown
    assert re.search(r"│ b +│ unreachable +│ 2\.00s", shown), shown
    assert re.search(r"│ a +│ .*forged.* +│ 1\.50s", shown), shown

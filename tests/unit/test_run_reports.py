"""What `logs`, `stop`, `fetch` and `clean` decide from their nodes' results (runs/commands.py,
steps/clean.py): the notes after the lines, when nothing was running, the missing paths, and the
listing-then-removal flow of `clean`. The CLI only renders these."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import CommandFailedError, ExitCode
from orchestrator.executor import GroupResult, Outcome
from orchestrator.runs.commands import FetchReport, LogsReport, StopReport
from orchestrator.runs.control import Fetched, StopResult
from orchestrator.runs.tail import FollowResult
from orchestrator.steps import clean
from orchestrator.steps.clean import CleanItem, CleanReport, NodeClean
from orchestrator.view import Said


def _read(exit_code: int | None, lines: int) -> FollowResult:
    return FollowResult(exit_code, ended=True, offset=10, lines=lines, reconnects=0)


def test_logs_says_what_became_of_each_copy_how_training_ended_and_where_the_copies_are() -> None:
    outcomes = GroupResult([Outcome("n1", _read(0, 3), None, 0.1), Outcome("n2", _read(None, 0), None, 0.1)])
    paths = {"n1": Path("runs/r1/n1.log"), "n2": Path("runs/r1/n2.log"), "n3": Path("runs/r1/n3.log")}
    copies = {"n1": "written", "n2": "kept", "n3": "busy"}
    report = LogsReport(outcomes, copies, run_id="r1", follow=True, paths=paths)
    assert report.notes() == [
        "n2: the previous copy runs/r1/n2.log was kept as it was",
        "n3: runs/r1/n3.log left as it is: a launch running from here (or another `logs`) writes it",
        "n1: training exited 0",
        # no exit code and no stop: killed outright (a host crash), not "stopped" as status says too
        "n2: training ended without an exit code: its processes were killed outright (SIGKILL, the OOM "
        "killer, a reboot or a crash of that machine)",
        "logs: runs/r1/",
    ]
    assert report.exit_code() == ExitCode.NODES_FAILED  # --follow: n2's training did not exit 0
    # a run stopped by `stop --run` (its exit code 1 is the stop's doing): said as stopped, 130 as
    # the launch it stopped exits
    stopped = dataclasses.replace(_read(1, 3), stopped=True)
    by_stop = LogsReport(GroupResult([Outcome("n1", stopped, None, 0.1)]), run_id="r1", follow=True)
    assert "n1: training was stopped" in by_stop.notes() and by_stop.exit_code() == ExitCode.INTERRUPTED
    # --tail writes no copy: no directory named, none in --json
    tail = LogsReport(outcomes, run_id="r1", tail=3)
    assert (tail.notes(), tail.log_dir, tail.exit_code()) == ([], None, ExitCode.OK)


def test_stop_says_nothing_was_running_only_when_every_node_answered_so() -> None:
    ended = Outcome("n1", StopResult("exited", exit_code=0), None, 0.1)
    assert StopReport(GroupResult([ended])).nothing_ran
    stopped = Outcome("n2", StopResult("stopped", terminated=2), None, 0.1)
    assert not StopReport(GroupResult([ended, stopped])).nothing_ran
    failed = Outcome[StopResult]("n2", None, CommandFailedError("no answer", node="n2"), 0.1)
    assert not StopReport(GroupResult([ended, failed])).nothing_ran


@pytest.mark.parametrize(
    ("from_code", "where"),
    [(False, "the run's outputs, its run directory or the code directory"), (True, "the code directory")],
)
def test_fetch_names_each_missing_path_and_where_it_was_looked_for(from_code: bool, where: str) -> None:
    found = [Fetched("a.txt", "/w/a.txt", 1, 2048, "runs/r1/n1/a.txt"), Fetched("b.txt", None)]
    report = FetchReport(GroupResult([Outcome("n1", found, None, 0.1)]), from_code=from_code)
    assert report.errors() == [f"node 'n1': b.txt not found in {where}"]
    assert report.exit_code() == ExitCode.NODES_FAILED
    assert found[0].size == "2 KiB"


def test_a_checkpoint_rank_0_alone_saved_is_fetched_and_the_others_lack_of_it_noted() -> None:
    """The usual DDP idiom saves on global rank 0 only: fetch copies it from that node and exits 0;
    the other nodes' lack of it is a note. A path on no node stays an error naming them."""
    have = [Fetched("ckpt/last.pt", "/w/out/ckpt/last.pt", 1, 9, "x"), Fetched("gone.txt", None)]
    lack = [Fetched("ckpt/last.pt", None), Fetched("gone.txt", None)]
    outcomes = [
        Outcome("n1", have, None, 0.1),
        Outcome("n2", lack, None, 0.1),
        Outcome("n3", lack, None, 0.1),
    ]
    report = FetchReport(GroupResult(outcomes))
    assert report.notes() == ["ckpt/last.pt: not on n2, n3 (copied from the nodes that have it)"]
    assert report.errors() == [
        "nodes 'n1', 'n2', 'n3': gone.txt not found in the run's outputs, its run directory or the code "
        "directory"
    ]
    assert report.exit_code() == ExitCode.NODES_FAILED
    partly = FetchReport(
        GroupResult([Outcome("n1", have[:1], None, 0.1), Outcome("n2", lack[:1], None, 0.1)])
    )
    assert partly.exit_code() == ExitCode.OK and partly.errors() == []


def test_fetch_names_the_newest_earlier_run_that_has_a_path_no_node_has_in_this_one() -> None:
    """The hint named the run before whether it had the path or not (a failed run without it, once);
    the nodes are asked which earlier runs have it: the newest that does is named, with its fetch."""

    def report(
        *nodes: list[Fetched], earlier: tuple[str, ...] = ("r0", "q9"), having: str = ""
    ) -> FetchReport:
        outcomes = [Outcome(f"n{i}", found, None, 0.1) for i, found in enumerate(nodes)]
        found = {"ckpt/last.pt": (having, "n1")} if having else {}
        return FetchReport(GroupResult(outcomes), earlier=list(earlier), elsewhere=found)

    missing = [Fetched("ckpt/last.pt", None)]
    assert report(missing, missing, having="q9").hint("r1") == (
        "ckpt/last.pt: in run q9 (n1 has it): `bootstrap fetch --run q9 ckpt/last.pt`"
    )
    assert report(missing, missing).hint("r1") == (
        "no node has ckpt/last.pt in run r1, nor in the 2 runs launched from here before it"
    )
    assert report(missing, earlier=("r0",)).hint("r1") == "no node has ckpt/last.pt in run r1, nor in r0"
    # a path one node has is this run's; no earlier run looked in: nothing to say
    assert (
        report(missing, [Fetched("ckpt/last.pt", "/w/ckpt/last.pt", 1, 9, "x")], earlier=()).hint("r1") == ""
    )
    assert report(missing, earlier=()).hint("r1") == ""


def _listing(*, running: bool = False, items: bool = True, removed: bool = False) -> CleanReport:
    node = NodeClean(
        "n1",
        items=[CleanItem("runs", "/w/runs", 10, 1)] if items else [],
        running=["r1"] if running else [],
        removed=removed,
    )
    return CleanReport(GroupResult([Outcome("n1", node, None, 0.1)]), removed=removed)


@pytest.mark.parametrize(
    ("dry_run", "running", "answer", "expected"),
    [
        (True, False, True, "listed"),  # --dry-run: the listing only, nothing asked
        (False, True, True, "listed"),  # a run running: nothing asked, nothing removed
        (False, False, False, "declined"),
        (False, False, True, "removed"),
        (False, False, None, "removed"),  # --yes: not asked
    ],
)
def test_clean_lists_then_asks_then_removes(
    dry_run: bool, running: bool, answer: bool | None, expected: str, monkeypatch: Any
) -> None:
    calls: list[bool] = []

    def clean_all(
        session: Any, inventory: Any, *, remove: bool, outputs: bool, runs: Any = None
    ) -> CleanReport:
        calls.append(remove)
        return _listing(running=running, removed=remove)

    monkeypatch.setattr(clean, "clean_all", clean_all)
    asked: list[CleanReport] = []

    def ask(found: CleanReport) -> bool:
        asked.append(found)
        return bool(answer)

    report = clean.clean_nodes(
        None,
        None,
        outputs=False,
        dry_run=dry_run,
        ask=None if answer is None else ask,  # type: ignore[arg-type]
    )
    outcome = "removed" if report.removed else "declined" if report.declined else "listed"
    assert outcome == expected
    assert calls == ([False, True] if expected == "removed" else [False])
    assert len(asked) == (1 if answer is not None and expected != "listed" else 0)
    if running:
        assert report.refusals() == [
            "n1: run r1 is running there: nothing was removed on any node (`bootstrap stop --run r1` ends it)"
        ]
        assert report.exit_code() == ExitCode.NODES_FAILED


def test_nodes_running_the_same_run_refuse_a_clean_in_one_line() -> None:
    busy = [NodeClean(n, items=[], running=["r1"], removed=False) for n in ("n1", "n2")]
    other = NodeClean("n3", items=[], running=["r2"], removed=False)
    outcomes = [Outcome(v.node, v, None, 0.1) for v in (*busy, other)]
    assert CleanReport(GroupResult(outcomes), removed=False).refusals() == [
        "n1, n2: run r1 is running there: nothing was removed on any node "
        "(`bootstrap stop --run r1` ends it)",
        "n3: run r2 is running there: nothing was removed on any node (`bootstrap stop --run r2` ends it)",
    ]


def test_a_clean_with_a_node_it_could_not_read_says_nothing_was_removed_and_how_on() -> None:
    """One node down: `clean --yes` showed a "to remove" table with sizes and the node's connection
    error, exit 3, and no word that nothing was removed on the others, nor how to clean them."""
    from orchestrator.errors import UnreachableError

    read = [NodeClean(n, items=[], running=[], removed=False) for n in ("n1", "n2")]
    outcomes = [Outcome(v.node, v, None, 0.1) for v in read]
    outcomes.append(Outcome("n3", None, UnreachableError("connection refused", node="n3"), 0.1))
    report = CleanReport(GroupResult(outcomes), removed=False)
    assert report.refusals() == [
        "nothing was removed on any node: n3 could not be read (a run may be running there, and its files"
        " are not listed); bring it back; or clean the others alone: `bootstrap clean --nodes n1,n2`"
    ]
    assert report.refusals(dry_run=True) == []  # the listing is what a dry run asked for
    # a clean of old runs only: the suggestion stays one (typed as given, it removes only those)
    chosen = CleanReport(GroupResult(outcomes), removed=False, options=("--outputs", "--keep", "2"))
    assert chosen.refusals()[0].endswith("`bootstrap clean --nodes n1,n2 --outputs --keep 2`")
    assert report.exit_code() == ExitCode.CONNECTION
    busy = NodeClean("n1", items=[], running=["r1"], removed=False)
    refused = CleanReport(GroupResult([Outcome("n1", busy, None, 0.1)]), removed=False)
    assert refused.refusals(dry_run=True) == [
        "n1: run r1 is running there: clean would remove nothing on any node"
        " (`bootstrap stop --run r1` ends it)"
    ]
    assert refused.exit_code() == ExitCode.NODES_FAILED  # as the clean itself would end


def test_fetch_says_when_a_path_came_from_the_code_directory_every_run_shares() -> None:
    """A script writing ckpt/ in its working directory (the code directory): `fetch --run R ckpt/`
    copied every run's checkpoints under runs/R/ and did not say they were not R's alone."""
    found = [
        Fetched("ckpt/", "/w/code/ckpt", 18, 9, "runs/r2/n1/ckpt"),
        Fetched("last.pt", "/w/runs/r2/n1/out/last.pt", 1, 9, "runs/r2/n1/last.pt"),
        Fetched("win.pt", "C:\\w\\runs\\r2\\n1\\out\\win.pt", 1, 9, "runs/r2/n1/win.pt"),
        Fetched("/abs/x", "/abs/x", 1, 9, "runs/r2/n1/abs/x"),
    ]
    report = FetchReport(GroupResult([Outcome("n1", found, None, 0.1)]))
    said = [s.text for s in report.said("r2") if isinstance(s, Said)]  # (under the table)
    assert said == [
        "n1: ckpt/ came from the code directory (/w/code/ckpt), which every run shares: not only run "
        "r2's (`fetch --code` looks there alone)"
    ]
    coded = FetchReport(GroupResult([Outcome("n1", found, None, 0.1)]), from_code=True).said("r2")
    assert [s for s in coded if isinstance(s, Said)] == []


def test_status_of_a_failed_run_names_the_node_whose_launcher_vanished_first() -> None:
    """A detached run whose node2 crashed: status showed three states and exited 1 without a line
    saying why or where to look. The vanished launcher (no exit code: killed outright) is named first,
    as the place to look; the others failed after it, with their last lines."""
    from orchestrator.runs.commands import StatusReport
    from orchestrator.runs.control import NodeStatus

    values = {
        "node1": NodeStatus(
            "exited", 1, last_line="[rank0]: RuntimeError: Connection closed by peer", failed_rank=(0, 1)
        ),
        "node2": NodeStatus("no exit code", None, last_line="[rank 1] step 15"),
        "node3": NodeStatus("exited", 0, last_line="done"),
    }
    report = StatusReport(GroupResult(Outcome(n, v, None, 0.1) for n, v in values.items()))
    lines = report.failure_lines("r1")
    assert (
        lines[0].startswith("node2: its launcher ended without an exit code")
        and "look there first" in lines[0]
    )
    assert "`bootstrap logs --run r1 --nodes node2`" in lines[0]
    assert lines[1:] == [
        "node1: exited (rank 0: exit 1), after node2: [rank0]: RuntimeError: Connection closed by peer"
    ]
    assert report.exit_code() == ExitCode.NODES_FAILED


def test_status_of_a_failed_detached_run_names_the_node_that_ended_first_first() -> None:
    """Rank 2 crashed (exit 7) on node3; node1 and node2 ended 3 s later (Connection closed by peer).
    status listed them in inventory order, the cause last; the foreground launch names who failed
    first. The nodes now come in the order they ended, the first named as such."""
    from orchestrator.runs.commands import StatusReport
    from orchestrator.runs.control import NodeStatus

    peer = "[rank0]: RuntimeError: Connection closed by peer"
    values = {
        "node1": NodeStatus("exited", 1, runtime=14.2, last_line=peer, failed_rank=(0, 1)),
        "node2": NodeStatus("exited", 1, runtime=14.1, last_line=peer, failed_rank=(1, 1)),
        "node3": NodeStatus("exited", 1, runtime=11.0, last_line="rank 2 crashing now", failed_rank=(2, 7)),
    }
    report = StatusReport(GroupResult(Outcome(n, v, None, 0.1) for n, v in values.items()))
    assert report.failure_lines("r1") == [
        "node3: exited (rank 2: exit 7) (failed first: the others ended after it): rank 2 crashing now",
        f"node2: exited (rank 1: exit 1): {peer}",
        f"node1: exited (rank 0: exit 1): {peer}",
    ]


def test_a_node_a_stop_could_not_reach_that_failed_after_its_peers_were_stopped_is_no_failure() -> None:
    """`stop --run` could not reach node2; its ranks then died on their stopped peers ("Connection
    closed by peer") and `status` called it a crash, exit 1. The record here names the nodes a stop
    did not reach: such a node's non-zero exit at or after the stop is said as what it is, exit 0.
    A crash before the stop, and any failure in a run no `stop --run` touched (a foreground
    launch's own stop of the others after a failure, in the same second), are still failures."""
    from orchestrator.runs.commands import StatusReport
    from orchestrator.runs.control import NodeStatus

    lost = "[rank1]: RuntimeError: Connection closed by peer"
    values = {
        "node1": NodeStatus("stopped", 143, runtime=40.0),
        "node2": NodeStatus("exited", 1, runtime=40.0, last_line=lost, failed_rank=(1, 1)),
        "node3": NodeStatus("stopped", 143, runtime=40.0),
    }

    def report(unreached: set[str], by_stop: frozenset[str] = frozenset({"node1", "node3"})) -> StatusReport:
        outcomes = GroupResult(Outcome(n, v, None, 0.1) for n, v in values.items())
        return StatusReport(outcomes, unreached=unreached, by_stop=set(by_stop))

    assert report({"node2"}).exit_code() == ExitCode.OK and report({"node2"}).failure_lines("r1") == []
    assert report({"node2"}).after_stop_lines() == [
        "node2: exited after node1, node3 were stopped: its ranks lost their peers (no failure of its own)"
    ]
    fail_fast = report(set())  # the launch stopped the others itself: node2 failed first
    assert fail_fast.exit_code() == ExitCode.NODES_FAILED and fail_fast.after_stop_lines() == []
    # stopped by a signal (the launch's own fail fast) before a stop --run that found nothing left to
    # stop there: that stop's moment is not theirs, and node2's failure is still one
    late = report({"node2"}, frozenset())
    assert late.exit_code() == ExitCode.NODES_FAILED and late.after_stop_lines() == []
    values["node2"] = NodeStatus("exited", 1, runtime=12.0, last_line="ValueError: bad batch")
    crashed = report({"node2"})
    assert crashed.exit_code() == ExitCode.NODES_FAILED and crashed.after_stop_lines() == []


def test_a_stop_notes_in_the_record_the_nodes_it_could_not_reach(tmp_path: Path) -> None:
    import json

    from orchestrator.runs.layout import note_stop, stop_nodes

    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r1", "nodes": {"node1": {}, "node2": {}}}))
    note_stop(tmp_path, ["node2"], ["node1"])
    note_stop(tmp_path, [])
    record = json.loads((tmp_path / "run.json").read_text())
    assert [s["unreached"] for s in record["stops"]] == [["node2"], []]
    assert stop_nodes(record, "unreached") == {"node2"} and stop_nodes(record, "stopped") == {"node1"}
    assert stop_nodes({"stops": "x"}, "unreached") == set()
    note_stop(tmp_path / "none", ["node2"])  # no record (a run not launched from here): nothing written
    assert not (tmp_path / "none").exists()


def test_a_run_a_node_lacks_is_said_as_this_machines_record_explains_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`status`/`logs`/`fetch` of a run whose directory a node lacks sent the user to check --run and
    the inventory, also where the record here knows why: a launch refused before it started there, a
    directory `clean --keep` removed since."""
    import json

    from orchestrator.inventory import load_inventory_text
    from orchestrator.runs.control import no_such_run

    monkeypatch.chdir(tmp_path)
    node = load_inventory_text(
        f"nodes:\n  - {{name: n1, host: 10.0.0.1, workdir: {tmp_path / 'wd'}}}\n", str(tmp_path / "h.yaml")
    ).nodes[0]
    for run_id, record in (
        ("r-gone", {"nodes": {"n1": {}}}),
        ("r-refused", {"nodes": {"n1": {}}, "not_started": True}),
    ):
        (tmp_path / "runs" / run_id).mkdir(parents=True)
        (tmp_path / "runs" / run_id / "run.json").write_text(json.dumps(record))
    (tmp_path / "runs" / "r-gone" / "n1.log").write_text("epoch 1\n")
    gone = no_such_run(node, "r-gone")
    assert (
        gone.message.startswith("run r-gone is gone from this node (")
        and "removed by `clean`" in gone.message
    )
    assert "runs/r-gone/n1.log here keeps what `logs` read of it" in gone.message and gone.hint is None
    refused = no_such_run(node, "r-refused")
    assert refused.message.startswith("run r-refused never started on this node"), refused.message
    unknown = no_such_run(node, "r-typo")
    assert unknown.message.startswith("no run r-typo on this node") and "check --run" in (unknown.hint or "")


def test_what_a_node_says_cannot_start_a_line_of_ours_or_a_command_we_suggest(tmp_path: Path) -> None:
    """A run id from a node's processes (any process of the node user may carry a marker) went raw
    into "run X is running there" and the `stop --run X` suggested with it; a file name into a
    failure line. Ids are kept only when they are run ids; every failure is one line."""
    import json

    from orchestrator import records
    from orchestrator.errors import TransferError
    from orchestrator.inventory import load_inventory_text
    from orchestrator.transports.base import Result
    from orchestrator.view import failures

    inventory = load_inventory_text(
        f"nodes:\n  - {{name: n1, host: 10.0.0.1, workdir: {tmp_path / 'wd'}}}\n", str(tmp_path / "h.yaml")
    )
    step = clean.Clean(inventory, remove=False, outputs=False)
    forged = ["r1\nerror: disk failing: run `bootstrap run -- $(id)`", "$(touch /tmp/x)", "lab-2"]
    answer = records.record(step.nonce, "clean", json.dumps({"items": [], "running": forged}))
    value = step.answer(inventory.nodes[0], answer, 0, Result("n1", "", 0, answer, "", 0.1))
    assert value.running == ["lab-2"]
    copy = TransferError("cannot copy /w/out/x\nerror: forged line to runs/r1/n1/x: gone", node="n1")
    (line,) = failures([Outcome("n1", None, copy, 0.1)])
    assert "\n" not in line.text and "x^Jerror: forged line" in line.text


def test_status_of_a_run_gone_quiet_says_when_each_node_last_wrote_and_that_a_rank_may_hang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hung rank in a detached run was invisible: `status` showed `running` and a last line of no
    age. A running node's silence is shown with its last line, and when no node's log grew for the
    stall time (BOOTSTRAP_STALL_NOTE, as the foreground launch says it) a note says what it may be."""
    from orchestrator.records import record
    from orchestrator.runs.commands import StatusReport
    from orchestrator.runs.control import NodeStatus, parse_status

    said = "".join(
        record("cb-0123456789ab", kind, value)
        for kind, value in (
            ("alive", "1"),
            ("now", "2000"),
            ("started", "1000"),
            ("spoke", "1100"),
            ("modified", "1990"),
        )
    )
    assert parse_status(said, "cb-0123456789ab").quiet == 900.0
    for hostile in ("-inf", "nan", "1e308"):  # a node's number that no JSON reader takes, or none sane
        odd = said.replace(
            record("cb-0123456789ab", "spoke", "1100"), record("cb-0123456789ab", "spoke", hostile)
        )
        assert parse_status(odd, "cb-0123456789ab").quiet is None, hostile
    values = {
        "node1": NodeStatus("running", runtime=1000, last_line="step 2 loss 0.47", quiet=900.0),
        "node2": NodeStatus("running", runtime=1000, last_line="rank 1 hanging now", quiet=905.0),
    }
    report = StatusReport(GroupResult(Outcome(n, v, None, 0.1) for n, v in values.items()))
    rows = report.view("r1").rows
    assert [cells[-1] for cells, _ in rows] == [
        "(15 min ago) step 2 loss 0.47",
        "(15 min ago) rank 1 hanging now",
    ]
    monkeypatch.setenv("BOOTSTRAP_STALL_NOTE", "600")
    (note,) = report.quiet_lines("r1")
    assert note.startswith("no rank has printed anything for 15 min: one may be hung"), note
    assert "stop --run r1" in note
    monkeypatch.setenv("BOOTSTRAP_STALL_NOTE", "1000")
    assert report.quiet_lines("r1") == []
    assert NodeStatus("running", quiet=900.0).public_dict()["quiet"] == 900.0

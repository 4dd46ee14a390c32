"""Fan-out: parallel, inventory order kept, one failure never hides the others."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from orchestrator.errors import CommandFailedError, ExitCode, UnreachableError
from orchestrator.executor import Executor, InternalError, NodeEvent, exit_code_for


def test_results_keep_input_order_and_run_in_parallel() -> None:
    barrier = threading.Barrier(4, timeout=10)  # only passes if all four run at once

    def work(i: int) -> int:
        barrier.wait()
        return i * i

    outcomes = Executor().map([3, 1, 2, 0], work, name=str, step="t")
    assert [o.node for o in outcomes] == ["3", "1", "2", "0"]
    assert [o.value for o in outcomes] == [9, 1, 4, 0]


def test_failures_are_isolated_and_named() -> None:
    def work(i: int) -> int:
        if i == 1:
            raise UnreachableError("down")
        if i == 2:
            raise KeyError("bug")
        return i

    events: list[NodeEvent] = []
    outcomes = Executor(on_event=events.append).map([0, 1, 2], work, name=lambda i: f"n{i}", step="t")
    assert outcomes[0].ok and outcomes[0].value == 0
    assert isinstance(outcomes[1].error, UnreachableError) and outcomes[1].error.node == "n1"
    assert isinstance(outcomes[2].error, InternalError) and "KeyError" in str(outcomes[2].error)
    assert exit_code_for(outcomes) == ExitCode.CONNECTION
    assert {(e.node, e.kind) for e in events} >= {("n0", "done"), ("n1", "failed"), ("n2", "failed")}


def test_exit_codes() -> None:
    ok = Executor().map([1], lambda i: i, name=str, step="t")
    assert exit_code_for(ok) == ExitCode.OK
    bad = Executor().map([1], lambda i: (_ for _ in ()).throw(CommandFailedError("x")), name=str, step="t")
    assert exit_code_for(bad) == ExitCode.NODES_FAILED
    assert exit_code_for(ok, lambda o: True) == ExitCode.NODES_FAILED


def test_fail_fast_cancels_the_others() -> None:
    cancelled = threading.Event()

    def work(i: int) -> int:
        if i == 0:
            raise CommandFailedError("boom")
        if not cancelled.wait(10):
            pytest.fail("cancel was not triggered")
        return i

    executor = Executor(cancel=cancelled.set)
    outcomes = executor.map([0, 1, 2], work, name=str, step="t", fail_fast=True)
    assert not outcomes[0].ok and outcomes[1].ok and executor.cancelled


_INTERRUPTED_FANOUT = """
import os, random, signal, sys, threading
from orchestrator.executor import Executor

random.seed(int(sys.argv[1]))
stop = threading.Event()

def work(i):
    stop.wait(random.random() * 0.02)  # nodes finishing all the time; after the cancel at once
    return i

threading.Timer(random.uniform(0.0, 0.8), os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    Executor(max_workers=64, cancel=stop.set).map(list(range(20000)), work, name=str, step="t")
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


@pytest.mark.parametrize("seed", range(6))
def test_ctrl_c_at_any_moment_of_a_fan_out_lets_the_process_end(seed: int) -> None:
    """Ctrl-C lands in the main thread wherever it is while nodes are handed out or finish. Raised
    there, it could land while concurrent.futures.wait() held some futures' locks (the workers
    finishing those futures hung, and the interpreter's exit, which joins them) or inside the pool's
    semaphore ("release unlocked lock"): 2 of 4 seeds hung before."""
    child = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_FANOUT, str(seed)], capture_output=True, text=True, timeout=30
    )
    assert child.stdout == "interrupted\n", child.stderr
    assert child.returncode == 0, child.stderr


_SIGNAL_TO_A_WORKER = """
import signal, threading
from orchestrator.executor import Executor

release, workers, ended = threading.Event(), [], []

def work(i):
    workers.append(threading.get_ident())
    ended.append("released" if release.wait(30) else "waited out")  # only a Ctrl-C ends it early
    return ended[-1]

def kill_a_worker():
    while not workers:
        threading.Event().wait(0.01)
    signal.pthread_kill(workers[0], signal.SIGINT)  # the kernel may hand a Ctrl-C to any thread

threading.Thread(target=kill_a_worker, daemon=True).start()
try:
    done = Executor(cancel=release.set).map([0], work, name=str, step="t")
    print("not interrupted:", done[0].value, flush=True)
except KeyboardInterrupt:
    while not ended:  # the cancel released it, or it waited its 30 s out
        threading.Event().wait(0.01)
    print("interrupted,", ended[0], flush=True)
"""


def test_a_ctrl_c_the_kernel_hands_to_a_worker_thread_still_interrupts() -> None:
    """A process-wide signal may be delivered to any thread: one that lands in a worker only sets
    CPython's flag, and the main thread, waiting for the nodes without end, never ran the handler
    (a `logs --follow` retrying a node ignored Ctrl-C until its node answered or gave up)."""
    child = subprocess.run(
        [sys.executable, "-c", _SIGNAL_TO_A_WORKER], capture_output=True, text=True, timeout=60
    )
    assert child.stdout == "interrupted, released\n", (child.stdout, child.stderr)


_LATE_SIGNAL = """
import os, queue, signal
from orchestrator.executor import _signals_into

try:
    with _signals_into(queue.SimpleQueue()):
        os.kill(os.getpid(), signal.SIGINT)  # after the last node was taken: nothing reads the queue
    print("lost", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_a_ctrl_c_after_the_last_node_finished_is_not_lost() -> None:
    """A Ctrl-C that comes while a fan-out has taken its last result (its handler only queued it)
    is raised as the fan-out ends: the next phase does not start."""
    child = subprocess.run([sys.executable, "-c", _LATE_SIGNAL], capture_output=True, text=True, timeout=30)
    assert child.stdout == "interrupted\n", (child.stdout, child.stderr)


def test_without_fail_fast_only_a_failure_stop_on_names_stops_the_others() -> None:
    """Validation waits for every node (a worker's failure is reported by rank 0 when its wait ends),
    but a node lost for good stops the others at once: they would wait for its ranks in vain."""
    lost = lambda o: isinstance(o.error, UnreachableError)  # noqa: E731

    def exited(i: int) -> int:
        if i == 0:
            raise CommandFailedError("a worker exited 1")
        return i

    calm = Executor(cancel=lambda: None)
    outcomes = calm.map([0, 1, 2], exited, name=str, step="t", stop_on=lost)
    assert [o.ok for o in outcomes] == [False, True, True] and not calm.cancelled
    cancelled = threading.Event()

    def gone(i: int) -> int:
        if i == 0:
            raise UnreachableError("the connection was lost while the command ran")
        if not cancelled.wait(10):
            pytest.fail("cancel was not triggered")
        return i

    executor = Executor(cancel=cancelled.set)
    outcomes = executor.map([0, 1, 2], gone, name=str, step="t", stop_on=lost)
    assert not outcomes[0].ok and outcomes[1].ok and executor.cancelled


def test_a_slow_node_is_announced_once_per_session() -> None:
    """`status` with a node down printed "waiting for node2 ... no answer yet" twice (two attempts
    while the first still waited): once is what it has to say."""
    from orchestrator.inventory import PasswordResolver, load_inventory_text
    from orchestrator.session import Session
    from orchestrator.transports import SSHOptions

    inventory = load_inventory_text("nodes:\n  - {name: node2, host: 10.0.0.2}\n", "hosts.yaml")
    said: list[str] = []
    session = Session(
        inventory,
        list(inventory.nodes),
        ssh=SSHOptions(),
        passwords=PasswordResolver(prompt=None),
        on_wait=lambda node, text: said.append(text),
    )
    session._waiting("node2", "10.0.0.2", 10.0)
    session._waiting("node2", "10.0.0.2", 10.0)
    assert said == ["waiting for node2 (10.0.0.2, up to 10 s): no answer yet"]

"""A foreground run whose ranks all went quiet (a hung rank) is said to be so, once per silence."""

from __future__ import annotations

import threading
import time

from orchestrator import records
from orchestrator.logs import RankedOutput
from orchestrator.runs.stall import StallWatch, stall_seconds

NONCE = "cb-0123456789ab"


def outputs() -> dict[str, RankedOutput]:
    return {
        "node1": RankedOutput("node1", None, None, first_rank=0, nproc=1, sample_nonce=NONCE),
        "node2": RankedOutput("node2", None, None, first_rank=1, nproc=1, sample_nonce=NONCE),
    }


def test_quiet_ranks_are_said_once_per_silence_quietest_node_first() -> None:
    ahead = [0.0]  # the watch's clock runs this much ahead of the one the outputs note times with
    outs = outputs()
    watch = StallWatch(outs, print, "lab-1", 300, clock=lambda: time.monotonic() + ahead[0])
    watch._started = time.monotonic()
    outs["node2"].block("stdout", "[default0]:step 3\n[default0]:FAULT hang\n")
    outs["node1"].block("stdout", "[default0]:step 3\n")
    # samples (the node's GPU/CPU load) arrive every few seconds: they are not a rank speaking
    heard_node1 = outs["node1"].heard
    outs["node1"].block("stdout", records.record(NONCE, "cpu", "0.5", "2"))
    assert outs["node1"].heard == heard_node1
    assert heard_node1 is not None and heard_node1[2] == "[node1:0] step 3"
    assert watch.check() is None  # not quiet for long enough
    ahead[0] = 301
    said = watch.check()
    assert said is not None and "for 5 min" in said and "stop --run lab-1" in said
    lines = said.splitlines()
    assert lines[1].startswith("  node2: last at ") and lines[1].endswith("[node2:1] FAULT hang")
    assert lines[2].endswith("[node1:0] step 3")
    assert watch.check() is None  # said once for this silence
    # a bar's newest state (a progress record) is a rank speaking: a new silence can be said again
    outs["node2"].block("stdout", records.record(NONCE, "progress", "0", " 50%|###"))
    ahead[0] = 0
    assert watch.check() is None
    ahead[0] = 301
    again = watch.check()  # node2 spoke last now: node1 is the quietest
    assert again is not None and again.splitlines()[2].endswith("[node2:1] FAULT hang")


def test_a_node_whose_ranks_never_printed_is_named_first() -> None:
    now = [0.0]
    outs = outputs()
    watch = StallWatch(outs, print, "r", 60, clock=lambda: now[0])
    outs["node1"].block("stdout", "[default0]:hello\n")
    now[0] = 1e9
    said = watch.check()
    assert said is not None and said.splitlines()[1] == "  node2: no line from its ranks yet"


def test_the_watch_says_it_from_its_thread_and_stops_with_the_run(monkeypatch) -> None:
    monkeypatch.setenv("BOOTSTRAP_STALL_NOTE", "0.2")
    assert stall_seconds() == 0.2
    said = threading.Event()
    with StallWatch(outputs(), lambda text: said.set(), "r", stall_seconds()) as watch:
        assert said.wait(10)
    assert watch._thread is not None and not watch._thread.is_alive()
    monkeypatch.setenv("BOOTSTRAP_STALL_NOTE", "0")
    with StallWatch(outputs(), lambda text: said.set(), "r", stall_seconds()) as watch:
        assert watch._thread is None  # never

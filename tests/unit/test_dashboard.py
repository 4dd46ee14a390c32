"""The dashboard's event model (orchestrator/dashboard/model.py) and its safety: node text reaches the
page as data only, secrets masked, a non-loopback listen refused without its token."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

from orchestrator import records
from orchestrator.dashboard.model import CONSEQUENCE, PENDING_BYTES, TAIL, LiveRun
from orchestrator.dashboard.server import DashboardServer, Listen, parse_listen
from orchestrator.errors import UsageError
from tests.unit.test_failure_cause import torchrun_named_the_worker_it_stopped


def _run() -> LiveRun:
    return LiveRun(["n1", "n2"], run_id="r1", labels={"n1": (0, 2), "n2": (2, 2)}, secrets=["s3cr3t-token"])


def metric(step: int, loss: float, speed: float) -> str:
    return "CB_METRIC " + json.dumps(
        {"kind": "window", "rank": 0, "step": step, "loss": loss, "samples_per_s": speed}
    )


def test_metric_lines_become_each_ranks_step_loss_and_speed_and_the_slowest_is_named() -> None:
    live = _run()
    live.block("n1", f"[default0]:{metric(10, 2.0, 100.0)}\n[default1]:{metric(10, 2.1, 90.0)}\n")
    live.block("n2", f"[default0]:{metric(10, 2.2, 95.0)}\n[default1]:{metric(10, 2.3, 40.0)}\nplain\n")
    delta = live.delta()
    ranks = {r["rank"]: r for r in delta["ranks"]}
    # the global rank comes from the node's first rank plus the tag, not the record's own "rank"
    assert {r: (d["node"], d["step"], d["loss"], d["samples_per_s"]) for r, d in ranks.items()} == {
        0: ("n1", 10, 2.0, 100.0),
        1: ("n1", 10, 2.1, 90.0),
        2: ("n2", 10, 2.2, 95.0),
        3: ("n2", 10, 2.3, 40.0),
    }
    assert delta["slowest"] == 3
    assert delta["lines"]["n2"] == ["plain"]  # the launcher's own line, under its node
    live.block("n1", f"[default0]:{metric(20, 1.5, 101.0)}\n")
    again = live.delta()
    assert [(r["rank"], r["step"]) for r in again["ranks"]] == [(0, 20)]
    assert [p[1:] for p in again["points"]["0"]] == [[20, 1.5, 101.0]]
    assert live.delta() == {}  # nothing new: no delta
    snap = live.snapshot()
    assert [p[1] for p in snap["points"]["0"]] == [10, 20]


def test_hostile_metric_lines_are_plain_output_read_once() -> None:
    """A rank's output is not obeyed: JSON nested past the parser's depth raised RecursionError (the
    node failed and the run stopped everywhere), and a long line of "CB_METRIC {}" made the metric
    pattern backtrack for minutes while holding the controller. Both are plain lines now."""
    from orchestrator.bench.cb_shares import parse_metric

    live = _run()
    deep = 'CB_METRIC {"a":' + "[" * 100_000 + "]" * 100_000 + "}"
    live.block("n1", f"[default0]:{deep}\n")
    assert parse_metric(deep) is None
    long = "CB_METRIC {}" * 200_000 + "x"  # quadratic before: hours; one pass now
    live.block("n1", f"[default1]:{long}\n[default1]:{metric(5, 1.0, 50.0)}\n")
    assert [(r["rank"], r["step"]) for r in live.delta()["ranks"] if r["step"] is not None] == [(1, 5)]
    # the first record of a line counts; what comes before CB_METRIC is not a tag
    live.block("n2", '[default0]:note CB_METRIC {"step": 7, "kind": "window"}\n')
    assert [(r["rank"], r["step"]) for r in live.delta()["ranks"]] == [(2, 7)]


def test_a_failure_carries_the_named_ranks_last_lines_even_those_not_yet_sent() -> None:
    live = _run()
    live.block("n2", "".join(f"[default1]:line {i}\n" for i in range(50)) + "[default0]:other\n")
    live.node_event("n2", "train", "failed", "node n2: rank 3 exited with code 3")
    events = live.delta()["events"]
    assert [(e["kind"], e["node"]) for e in events] == [("failure", "n2")]
    assert events[0]["lines"] == [f"line {i}" for i in range(30, 50)]
    # after a cancel, a node's failure is a stop, not a cause
    live.node_event("n1", "train", "failed", "stopped", cancelled=True)
    assert [e["kind"] for e in live.delta()["events"]] == ["stop"]
    assert live.nodes["n1"]["state"] == "stopped" and live.nodes["n2"]["state"] == "failed"


def test_memory_stays_bounded_whatever_a_node_prints() -> None:
    live = _run()
    block = "".join(f"[default0]:{'x' * 100} {i}\n" for i in range(1000))
    for _ in range(100):  # 10 MB without a flush
        live.block("n1", block)
    assert sum(len(b) for b in live._pending["n1"]) <= PENDING_BYTES + len(block)
    delta = live.delta()
    assert len(delta["lines"]["0"]) == TAIL and delta["lines"]["0"][-1].endswith(" 999")
    assert live.nodes["n1"]["lines"] == 100_000  # every line counted
    assert len(live.ranks[0].lines) == TAIL


def test_secrets_and_url_credentials_are_masked_and_long_lines_cut() -> None:
    live = _run()
    live.block(
        "n1", "[default0]:token s3cr3t-token via https://user:pw@host/simple\n[default1]:" + "y" * 5000 + "\n"
    )
    lines = live.delta()["lines"]
    assert lines["0"] == ["token *** via https://***@host/simple"]
    assert len(lines["1"][0]) < 2100 and "3000 more characters" in lines["1"][0]


def test_the_page_renders_node_text_as_text_only() -> None:
    """app.js must never turn a string into markup: no innerHTML/outerHTML/insertAdjacentHTML,
    document.write, eval or string timers; text goes in through textContent or createTextNode."""
    static = resources.files("orchestrator.dashboard").joinpath("static")
    script = static.joinpath("app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script, sink
    assert not re.search(r"set(Timeout|Interval)\(\s*['\"`]", script)
    assert "textContent" in script
    page = static.joinpath("index.html").read_text()
    assert "<script>" not in page and "http" not in page.split("<body>")[0]  # nothing inline, no CDN


@pytest.fixture
def served() -> Iterator[tuple[LiveRun, DashboardServer]]:
    live = _run()
    server = DashboardServer(live, Listen("127.0.0.1", 0))
    server.start()
    try:
        yield live, server
    finally:
        server.stop()


def test_every_answer_forbids_inline_script_and_framing(served: tuple[LiveRun, DashboardServer]) -> None:
    _, server = served
    with urllib.request.urlopen(server.url) as page:
        csp = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    with urllib.request.urlopen(server.link("api/state")) as state:
        assert json.load(state)["run"]["run_id"] == "r1"


def test_loopback_refuses_a_foreign_host_header(served: tuple[LiveRun, DashboardServer]) -> None:
    _, server = served  # a page elsewhere that rebinds its name to 127.0.0.1 (DNS rebinding)
    request = urllib.request.Request(server.link("api/state"), headers={"Host": "attacker.example"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    assert refused.value.code == 403


def test_non_loopback_needs_the_token() -> None:
    server = DashboardServer(None, Listen("0.0.0.0", 0))
    assert server.token and len(server.token) >= 24
    assert server.refusal("192.0.2.1:8787", None) and server.refusal("192.0.2.1:8787", "wrong")
    assert server.refusal("192.0.2.1:8787", server.token) is None


def test_loopback_needs_the_token_too(served: tuple[LiveRun, DashboardServer]) -> None:
    """Another user of the controller reaches loopback as well: without the token printed at start
    the runs' logs (``runs/`` is the controller user's, 0700) are refused to them; the page's script
    and style, which hold no data, are not."""
    _, server = served
    bare = server.url.split("?")[0]
    for target in (bare, bare + "api/state", bare + "api/runs", server.link("api/runs") + "x"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(target)
        assert refused.value.code == 403, target
    with urllib.request.urlopen(bare + "static/app.js") as script:
        assert script.status == 200
    with urllib.request.urlopen(server.link("api/runs")) as runs:
        assert runs.status == 200


def test_listen_addresses() -> None:
    assert parse_listen("0.0.0.0") == Listen("0.0.0.0", 8787)
    assert parse_listen("10.0.0.5:0") == Listen("10.0.0.5", 0)
    assert parse_listen("[::1]:9000") == Listen("::1", 9000) and Listen("::1").loopback
    for bad in ("example.com", "1.2.3.4:http", "1.2.3.4:70000"):
        with pytest.raises(UsageError):
            parse_listen(bad)


def test_a_failure_event_takes_in_the_culprits_lines_that_arrive_after_torchruns_word() -> None:
    """torchrun's line about a dead worker and the worker's own last lines travel separately on the
    node: the event shows the worker's last words even when they come second."""
    live = _run()
    live.block("n2", "[default1]:step 7\n")
    live.block(
        "n2", "E1205 12:00:00 api.py:1002] failed (exitcode: 3) local_rank: 1 (pid: 741) of binary: py\n"
    )
    (event,) = live.delta()["events"]
    assert event["message"] == "rank 3 exited with code 3" and event["lines"] == ["step 7"]
    live.block("n2", "[default1]:last words\n")
    (again,) = live.delta()["events"]
    assert again["id"] == event["id"] and again["lines"] == ["step 7", "last words"]
    live.node_event("n2", "train", "failed", "node n2: rank 3 exited with code 3")
    assert [e["kind"] for e in live.snapshot()["events"]] == ["failure"]  # one failure, not two


def test_a_rank_printing_torchruns_words_is_not_a_failure() -> None:
    """torchrun's "failed (exitcode: ...)" is its agent's own line; a rank printing it (tagged
    [defaultN]:) reports nothing."""
    live = _run()
    live.block(
        "n2",
        "[default0]:E1205 12:00:00 api.py:1002] failed (exitcode: 9) local_rank: 1 (pid: 4242) of binary:\n",
    )
    assert not [e for e in live.snapshot()["events"] if e["kind"] == "failure"]


def test_status_watch_table_shows_each_ranks_figures_and_marks_the_slowest() -> None:
    from rich.console import Console

    from orchestrator.cli.runs import watch_table

    live = LiveRun(["n1", "n2"], labels={"n1": (0, 2), "n2": (2, 2)}, sample_nonce=NONCE)
    live.block("n1", f"[default0]:{metric(4, 1.25, 80.0)}\n[default1]:{metric(4, 1.5, 20.0)}\n")
    live.block("n1", records.record(NONCE, "gpu", "0, 87, 20513, 24576", "1, [N/A], 1024, 24576"))
    live.block("n2", "\x1b]0;title\x07[default0]:no metric yet\n" + records.record(NONCE, "cpu", "1.50", "4"))
    live.node_event("n2", "logs", "failed", "rank 2 exited with code 1")
    console = Console(width=160, record=True, color_system=None)
    console.print(watch_table(live))
    text = " ".join(console.export_text().replace("\u2502", " ").split())
    assert (
        "n1 waiting 2 0: 87% 20513/24576 MiB 1: ?% 1024/24576 MiB 0 4 1.2500 80.0 1 4 1.5000 20.0 slowest "
        "n2 failed 1 load 1.50 / 4 CPUs 2 - - - 3 - - -"
    ) in text, text
    assert "failure: n2 rank 2 exited with code 1" in text and "\x1b" not in text


def test_the_failure_names_the_culprit_not_the_colocated_rank_that_died_of_its_closed_connection() -> None:
    """Recorded: node 2's local rank 1 (rank 3) exited 3, its local rank 0 (rank 2) died of the closed
    gloo connection in the same second, and torchrun's "failed" line and root cause name rank 2."""
    recorded = (Path(__file__).parent / "data" / "torchrun" / "culprit_local_rank_1.log").read_text()
    cut = recorded.index("\n", recorded.index("failed (exitcode: ")) + 1
    for blocks in ([recorded], [recorded[:cut], recorded[cut:]], recorded.splitlines(keepends=True)):
        live = LiveRun(["n1", "n2"], labels={"n1": (0, 2), "n2": (2, 2)})
        for block in blocks:
            live.block("n2", block)
        (event,) = [e for e in live.snapshot()["events"] if e["kind"] == "failure"]
        assert event["message"] == "rank 3 exited with code 3", len(blocks)
        assert event["lines"][-1] == "culprit last words: out of patience"
        # the node's end (the launch names the same rank) completes that event, no second one
        live.node_event("n2", "train", "failed", "node n2: rank 3 exited with code 3 (torchrun exited 1)")
        assert [e["message"] for e in live.snapshot()["events"]] == ["rank 3 exited with code 3"]


def test_a_node_whose_ranks_died_of_a_peers_closed_connection_is_shown_as_a_consequence() -> None:
    """Recorded, both nodes of one run: n2's rank 3 exited 3; n1's ranks died of the closed gloo
    connection (its torchrun may end first). n1's failure says it is a consequence; n2's does not."""
    data = Path(__file__).parent / "data" / "torchrun"
    live = LiveRun(["n1", "n2"], labels={"n1": (0, 2), "n2": (2, 2)})
    live.block("n1", (data / "victim_node_first_of_2.log").read_text())
    live.block("n2", (data / "culprit_node_second_of_2.log").read_text())
    events = {e["node"]: e for e in live.snapshot()["events"] if e["kind"] == "failure"}
    assert events["n1"]["message"] == "rank 1 exited with code 1" + CONSEQUENCE
    assert "Connection closed by peer" in events["n1"]["lines"][-1]
    assert events["n2"]["message"] == "rank 3 exited with code 3"
    assert events["n2"]["lines"][-1] == "culprit last words: out of patience"
    # torchrun may name as its root cause the worker it stopped itself (tests/unit/test_failure_cause.py)
    live = LiveRun(["n1", "n2"], labels={"n1": (0, 2), "n2": (2, 2)})
    recorded = (data / "victim_node_first_of_2.log").read_text()
    live.block(
        "n1",
        torchrun_named_the_worker_it_stopped(
            recorded,
            "rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 3722)  (SIGTERM)",
            "rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 3723) ",
        ),
    )
    (event,) = [e for e in live.snapshot()["events"] if e["kind"] == "failure"]
    assert event["message"] == "rank 1 exited with code 1" + CONSEQUENCE


NONCE = "cb-0123456789ab"


def test_the_nodes_samples_reach_the_page_per_node_and_per_gpu_and_only_of_the_runs_nonce() -> None:
    """The rank capture's sample records (steps/probes/rank_capture.py) become each node's GPU use,
    or CPU load; a record of another nonce, or one a rank printed (tagged), is a line like any other."""
    live = LiveRun(["n1", "n2"], labels={"n1": (0, 1), "n2": (1, 1)}, sample_nonce=NONCE)
    live.delta()
    forged = records.record(NONCE, "gpu", "0, 100, 1, 1")
    live.block(
        "n1", "[default0]:step 1\n" + records.record(NONCE, "gpu", "0, 87, 20513, 24576", "1, 3, 1024, 24576")
    )
    live.block("n2", records.record("cb-ffffffffffff", "gpu", "0, 100, 1, 1") + "[default0]:" + forged)
    live.block("n2", records.record(NONCE, "cpu", "0.25", "2"))
    nodes = {n["node"]: n for n in live.delta()["nodes"]}
    assert nodes["n1"]["gpus"] == [
        {"index": "0", "util_percent": 87.0, "mem_used_mib": 20513.0, "mem_total_mib": 24576.0},
        {"index": "1", "util_percent": 3.0, "mem_used_mib": 1024.0, "mem_total_mib": 24576.0},
    ]
    assert nodes["n1"]["load"] is None
    assert nodes["n2"]["gpus"] == [] and nodes["n2"]["load"] == {"load": 0.25, "cpus": 2}
    assert live.snapshot()["lines"]["1"] == [forged.rstrip("\n")]  # the rank's line, shown as text
    # the node's own samples are not lines it printed: neither the node's nor a rank's last lines
    lines = live.snapshot()["lines"]
    assert (
        lines["0"] == ["step 1"]
        and lines["n1"] == []
        and lines["n2"] == [records.record("cb-ffffffffffff", "gpu", "0, 100, 1, 1").rstrip("\n")]
    )
    unknown = LiveRun(["n1"], labels={"n1": (0, 1)})  # a run whose nonce is not known: no samples
    unknown.block("n1", records.record(NONCE, "gpu", "0, 87, 20513, 24576"))
    assert "gpus" not in unknown.snapshot()["nodes"][0]


def test_the_terminal_shows_the_lines_without_the_sample_records(tmp_path: Path) -> None:
    import io

    from orchestrator.cli.ui import LinePrinter
    from orchestrator.logs import RankedOutput

    out = io.StringIO()
    printer = LinePrinter(["n1"], out, color=False)
    shown = RankedOutput("n1", None, printer, nproc=1, sample_nonce=NONCE)
    shown.block("stdout", "[default0]:a\n" + records.record(NONCE, "cpu", "0.25", "2") + "[default0]:b\n")
    shown.block("stdout", records.record(NONCE, "cpu", "0.25", "2"))
    assert out.getvalue() == "[n1:0] a\n[n1:0] b\n"

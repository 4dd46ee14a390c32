"""The bench's pure parts: probe records, scaling arithmetic, metrics, node sets, the HTML page."""

from __future__ import annotations

import dataclasses
import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from orchestrator.bench.cb_shares import metric_line, parse_metric
from orchestrator.bench.probe import ProbeReport, RankSpeed
from orchestrator.bench.report import render_html, scaling_rows
from orchestrator.bench.scaling import (
    RankFigures,
    ScalingReport,
    ScalingRun,
    node_sets,
    read_metrics,
    sub_inventory,
)
from orchestrator.errors import InventoryError
from orchestrator.inventory import load_inventory_text


def _honest(report: ProbeReport, record: dict[str, Any]) -> None:
    """``record`` as the node that runs its rank sends it, on a line tagged with that rank."""
    rank = record["rank"]
    report.feed(record, report.ranks[rank].node, rank)


INVENTORY = """\
cluster:
  name: lab
  master: b
  train: {{script: examples/train_ddp.py, args: ["--epochs", "1"]{extra}}}
nodes:
  - {{name: a, host: 10.0.0.1}}
  - {{name: b, host: 10.0.0.2, nproc: 2}}
  - {{name: c, host: 10.0.0.3}}
"""


def _probe() -> ProbeReport:
    ranks = {r: RankSpeed(r, n, lr) for r, (n, lr) in enumerate([("a", 0), ("b", 0), ("b", 1), ("c", 0)])}
    report = ProbeReport(world_size=4, ranks=ranks, batch_size=64, repeats=3, workload="mlp", measured_at="T")
    for rank, rate in enumerate([1000.0, 900.0, 880.0, 250.0]):
        _honest(report, {"kind": "start", "rank": rank, "device": f"CPU x{rank}", "host": "h"})
        _honest(
            report,
            {
                "kind": "result",
                "rank": rank,
                "rates": [rate * 0.98, rate, rate * 1.01],
                "samples_per_s": rate,
                "spread": 0.03,
            },
        )
    return report


def test_probe_records_give_speeds_the_slowest_rank_and_its_shares() -> None:
    report = _probe()
    assert report.ok and report.rates() == [1000.0, 900.0, 880.0, 250.0]
    slowest = report.slowest()
    assert slowest is not None and (slowest.rank, slowest.node) == (3, "c")
    doc = report.shares()
    # quotas of 256 over 3030 samples/s: 84.49, 76.04, 74.35, 21.12; the spare sample to rank 0
    assert doc.global_batch == 256 and doc.shares == [85, 76, 74, 21]
    assert [(r["node"], r["local_rank"]) for r in doc.ranks] == [("a", 0), ("b", 0), ("b", 1), ("c", 0)]
    assert doc.probe is not None and doc.probe["ranks"][3]["samples_per_s"] == 250.0
    _honest(report, {"kind": "missing", "rank": 0, "ranks": [2]})
    assert not report.ok


def test_a_rank_whose_workload_failed_is_not_measured() -> None:
    report = _probe()
    report.ranks[1].samples_per_s = None
    _honest(report, {"kind": "error", "rank": 1, "error": "ImportError: no module mymodels"})
    assert not report.ok and report.ranks[1].error == "ImportError: no module mymodels"


def test_node_sets_start_with_the_master_and_keep_inventory_order() -> None:
    inventory = load_inventory_text(INVENTORY.format(extra=""), "lab.yaml")
    assert [[n.name for n in s] for s in node_sets(inventory)] == [["b"], ["a", "b"], ["a", "b", "c"]]


def test_a_scaling_run_is_the_inventory_bounded_with_equal_shares_and_fixed_ranks() -> None:
    inventory = load_inventory_text(INVENTORY.format(extra=", shares: measured"), "lab.yaml")
    sub = sub_inventory(inventory, inventory.nodes[:2], steps=30, log_every=10)
    assert [n.name for n in sub.nodes] == ["a", "b"] and len(inventory.nodes) == 3
    train = sub.cluster.train
    assert train.args == ("--epochs", "1", "--max-steps", "30", "--log-every", "10")
    assert train.shares == "equal" and train.elastic is False
    assert inventory.cluster.train.shares == "measured"  # the original is untouched


def _summary(rank: int, seconds: float, compute: float, shares: list[int]) -> dict[str, Any]:
    return {
        "kind": "summary",
        "rank": rank,
        "steps": 40,
        "seconds": seconds,
        "step_time": seconds / 40,
        "compute_time": compute,
        "global_samples": 40 * sum(shares),
        "shares": shares,
    }


def test_metrics_give_throughput_from_the_slowest_clock_and_each_ranks_times() -> None:
    run = ScalingRun(["a", "b"], 2, "measured", "x")
    records = [
        _summary(0, 2.0, 0.03, [100, 28]),
        _summary(1, 2.5, 0.045, [100, 28]),
        {"kind": "window", "rank": 0, "step": 10, "loss": 2.25},
        {"kind": "window", "rank": 1, "step": 10, "loss": 2.25},
        {"kind": "window", "rank": 0, "step": 20, "loss": 2.0},
    ]
    read_metrics(run, records, {0: "a", 1: "b"})
    assert run.ok and run.samples_per_s == pytest.approx(40 * 128 / 2.5)
    assert run.shares == [100, 28] and run.global_batch == 128
    assert [(f.node, f.share, f.compute_time) for f in run.per_rank] == [("a", 100, 0.03), ("b", 28, 0.045)]
    assert run.losses == [(10, 2.25), (20, 2.0)]
    silent = ScalingRun(["a", "b"], 2, "equal", "y")
    read_metrics(silent, records[:1], {0: "a", 1: "b"})
    assert not silent.ok and "no CB_METRIC summary from rank(s) 1" in (silent.error or "")


def test_metric_lines_round_trip_and_other_text_is_ignored() -> None:
    line = metric_line(kind="window", rank=2, loss=None, samples_per_s=12.5)
    assert line.startswith("CB_METRIC {") and "\n" not in line
    assert parse_metric("[rank 0/2] " + line) == {
        "kind": "window",
        "rank": 2,
        "loss": None,
        "samples_per_s": 12.5,
    }
    assert parse_metric("CB_METRIC {not json") is None and parse_metric("loss 2.0") is None


def _scaling() -> ScalingReport:
    def run(
        nodes: list[str], ranks: int, mode: str, rate: float, per_rank: list[tuple[float, float, int]]
    ) -> ScalingRun:
        figures = [
            RankFigures(
                rank=i,
                node=nodes[min(i, len(nodes) - 1)],
                share=share,
                step_time=step,
                compute_time=compute,
                steps=40,
            )
            for i, (step, compute, share) in enumerate(per_rank)
        ]
        return ScalingRun(nodes, ranks, mode, f"b-n{len(nodes)}-{mode}", samples_per_s=rate, per_rank=figures)

    runs = [
        run(["m"], 1, "equal", 1000.0, [(0.064, 0.06, 64)]),
        run(["m"], 1, "measured", 1000.0, [(0.064, 0.06, 64)]),
        run(["m", "s"], 2, "equal", 800.0, [(0.16, 0.05, 64), (0.16, 0.155, 64)]),
        run(["m", "s"], 2, "measured", 1500.0, [(0.085, 0.08, 102), (0.085, 0.06, 26)]),
    ]
    return ScalingReport(runs, 40, {("m", 0): 1000.0, ("s", 0): 250.0})


def test_speed_up_and_efficiency_are_against_the_first_set_with_equal_shares() -> None:
    rows = _scaling().rows()
    assert [(r.nodes, r.ranks) for r in rows] == [(1, 1), (2, 2)]
    rate, speedup, efficiency = rows[1].figures["measured"]
    assert (rate, speedup, efficiency) == (1500.0, 1.5, 0.75)
    assert rows[1].figures["equal"] == (800.0, 0.8, 0.4)
    assert rows[1].probe_bound == 1.25  # (1000 + 250) / 1000


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.data: dict[str, Any] | None = None
        self._in_data = False
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))
        self._in_data = tag == "script" and dict(attrs).get("id") == "bench-data"

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._in_data:
            self.data = json.loads(self._text)
            self._in_data = False

    def handle_data(self, data: str) -> None:
        if self._in_data:
            self._text += data


def test_the_html_page_holds_every_measured_point_and_nothing_external(tmp_path: Path) -> None:
    scaling = _scaling()
    text = render_html(
        title="Scaling of lab </script><b>", probe=_probe(), scaling=scaling, data=scaling.public_dict()
    )
    page = _Page()
    page.feed(text)
    points = {
        (a["data-series"], int(a["data-nodes"] or 0)): float(a["data-speedup"] or 0)
        for tag, a in page.elements
        if tag == "circle" and a.get("class") == "point"
    }
    assert points == {("equal", 1): 1.0, ("measured", 1): 1.0, ("equal", 2): 0.8, ("measured", 2): 1.5}
    lines = {a["data-series"] for tag, a in page.elements if tag == "polyline"}
    assert lines == {"equal", "measured", "ideal", "probe"}
    bars = {
        (a["data-mode"], int(a["data-rank"] or 0), a["data-kind"]): float(a["data-seconds"] or 0)
        for tag, a in page.elements
        if tag == "rect" and a.get("class") == "bar"
    }
    assert bars[("equal", 1, "compute")] == 0.155 and bars[("measured", 1, "compute")] == 0.06
    assert bars[("equal", 0, "step")] == 0.16 and bars[("measured", 0, "step")] == 0.085
    # the embedded data is the report's, and the hostile title did not end the script block early
    assert page.data == json.loads(json.dumps(scaling.public_dict()))
    assert "<b>" not in text and "&lt;/script&gt;&lt;b&gt;" in text
    # self-contained: nothing is fetched (the SVG namespace is a name, not a request)
    for tag, attrs in page.elements:
        assert tag not in ("link", "img", "iframe", "object", "embed"), tag
        assert not any(k in ("src", "href", "xlink:href") for k in attrs), (tag, attrs)
        assert not (tag == "script" and attrs.get("type") != "application/json"), attrs
    assert "url(" not in text and "@import" not in text
    (tmp_path / "scaling.html").write_text(text)  # opens in a browser as it is


@pytest.mark.parametrize(
    ("shares", "words"),
    [
        (
            "[1, 2]",
            "2 number(s), but the cluster has 3 node(s) and 4 rank(s): "
            "give one per rank (4) or one per node (3)",
        ),
        ("[5, 1, 5]", "1 for node 'b' is less than its 2 ranks"),
        ("[5, 0, 5]", "item 2 (0) is not an integer >= 1"),
        ("quick", "'quick' is not equal, measured or a list of integers"),
    ],
)
def test_the_shares_setting_is_checked_against_the_nodes(shares: str, words: str) -> None:
    with pytest.raises(InventoryError) as caught:
        load_inventory_text(INVENTORY.format(extra=f", shares: {shares}"), "lab.yaml")
    text = str(caught.value)
    assert "lab.yaml" in text and "train.shares" in text and words in text, text


def test_the_shares_setting_per_rank_per_node_or_by_name() -> None:
    for shares, expected in (
        ("measured", "measured"),
        ("[1, 2, 3, 4]", (1, 2, 3, 4)),
        ("[5, 2, 5]", (5, 2, 5)),
    ):
        inventory = load_inventory_text(INVENTORY.format(extra=f", shares: {shares}"), "lab.yaml")
        assert inventory.cluster.train.shares == expected
    assert load_inventory_text(INVENTORY.format(extra=""), "lab.yaml").cluster.train.shares == "equal"


def test_per_rank_shares_need_a_static_rendezvous() -> None:
    with pytest.raises(InventoryError, match="elastic: true assigns the ranks anew"):
        load_inventory_text(INVENTORY.format(extra=", shares: measured, elastic: true"), "lab.yaml")


def test_with_several_rounds_the_tables_show_the_median_run_and_the_page_every_round() -> None:
    scaling = _scaling()
    scaling.rounds = 3
    second = next(r for r in scaling.runs if len(r.nodes) == 2 and r.mode == "measured")
    for rate in (1200.0, 2400.0):  # rounds 2 and 3 of the same set and mode
        scaling.runs.append(dataclasses.replace(second, samples_per_s=rate, run_id=f"x{rate}"))
    failed = dataclasses.replace(second, samples_per_s=None, error="node2 failed", run_id="bad")
    scaling.runs.append(failed)  # a failed round is never the one shown
    chosen = scaling.run(2, "measured")
    assert chosen is not None and chosen.samples_per_s == 1500.0
    assert scaling.round_rates(2, "measured") == [1500.0, 1200.0, 2400.0]
    (row,) = [r for r in scaling_rows(scaling) if r[0] == "2"]
    assert row[5] == "1500 (1200-2400)" and row[2] == "800"
    page = _Page()
    page.feed(render_html(title="t", probe=None, scaling=scaling, data={}))
    faint = sorted(
        float(a["data-samples-per-s"] or 0)
        for tag, a in page.elements
        if tag == "circle" and a.get("class") == "round"
    )
    assert faint == [1200.0, 1500.0, 2400.0]
    assert not scaling.ok  # the failed round is reported


def test_a_node_cannot_measure_another_nodes_rank() -> None:
    # c (rank 3) claims rank 0 is slow and that rank 1's device is its own text
    report = _probe()
    report.feed({"kind": "result", "rank": 0, "samples_per_s": 0.001, "rates": [0.001]}, "c", 3)
    report.feed({"kind": "start", "rank": 1, "device": "FORGED", "host": "h"}, "c", 1)
    report.feed({"kind": "missing", "rank": 0, "ranks": [1]}, "c", None)
    assert report.ranks[0].samples_per_s == 1000.0 and report.ranks[1].device == "CPU x1"
    assert report.ok and report.forged == {"c": 3}
    assert report.shares().shares == [85, 76, 74, 21]
    assert report.public_dict()["forged_records"] == {"c": 3}
    assert "forged_records" not in _probe().public_dict()


def test_noisy_measurements_are_said_before_their_shares_are_trusted() -> None:
    """Three identical nodes, a busy machine: spreads of 40-125 % between repeats, "rank 1 ... 4.89x
    slower", shares 134/27/31, and nothing said. A spread over 25 % is a warning naming the ranks."""
    from orchestrator.bench.engine import probe_noise

    ranks = {
        0: RankSpeed(0, "ws1", 0, samples_per_s=77475, spread=0.396),
        1: RankSpeed(1, "ws2", 0, samples_per_s=15859, spread=1.245),
        2: RankSpeed(2, "ws3", 0, samples_per_s=17666, spread=0.05),
    }
    said = probe_noise(ProbeReport(world_size=3, ranks=ranks, batch_size=64, repeats=5, workload="mlp"))
    assert said.startswith("the measurements are noisy: rank 0 on ws1 (40 %), rank 1 on ws2 (125 %)"), said
    assert "--repeats" in said
    ranks = {r: RankSpeed(r, "ws1", r, samples_per_s=100.0, spread=0.05) for r in range(2)}
    assert probe_noise(ProbeReport(world_size=2, ranks=ranks, batch_size=64, repeats=5, workload="mlp")) == ""

"""Which global rank a `[defaultN]:` line of a node is: `launch` and `logs` label lines with it."""

from __future__ import annotations

import io

from orchestrator.cli.ui import LinePrinter
from orchestrator.inventory import load_inventory_text
from orchestrator.logs import RankedOutput
from orchestrator.runs.ranks import rank_labels

NODES = """
nodes:
  - {name: a, host: 10.0.0.1, nproc: 2}
  - {name: b, host: 10.0.0.2, nproc: 1}
  - {name: c, host: 10.0.0.3, nproc: 3}
"""


def test_static_ranks_follow_the_inventory_order() -> None:
    inventory = load_inventory_text("cluster: {master: a}\n" + NODES, "lab.yaml")
    assert rank_labels(inventory) == {"a": (0, 2), "b": (2, 1), "c": (3, 3)}


def test_elastic_lines_carry_the_global_rank_the_rendezvous_gave() -> None:
    inventory = load_inventory_text("cluster: {master: a, train: {elastic: true}}\n" + NODES, "lab.yaml")
    labels = rank_labels(inventory)
    assert labels == {"a": (0, 6), "b": (0, 6), "c": (0, 6)}
    # node c came first to the rendezvous: its ranks are 0-2, and its lines say so
    shown = io.StringIO()
    printer = LinePrinter(["a", "b", "c"], shown, color=False)
    first, count = labels["c"]
    RankedOutput("c", None, printer, first_rank=first, nproc=count).block(
        "stdout", "[default2]:hi\n[default5]:x\n"
    )
    assert [line.split() for line in shown.getvalue().splitlines()] == [["[c:2]", "hi"], ["[c:5]", "x"]]


def test_a_line_redrawn_with_carriage_returns_is_shown_as_its_last_state_under_its_label() -> None:
    """A rank's bar redrawn with "\r": its newest state (a progress record) shown as the rank's line,
    and the finished line as what a terminal shows of it, its last state, not every redraw joined by
    "^M"; the log keeps every byte. A lone "\r" cannot hide the label either way."""
    from orchestrator import records

    nonce = "cb-0123456789ab"
    shown, kept = io.StringIO(), []

    class Log:
        def write_block(self, node: str, text: str) -> None:
            kept.append(text)

    printer = LinePrinter(["a"], shown, color=False)
    out = RankedOutput("a", Log(), printer, first_rank=0, nproc=2, sample_nonce=nonce)  # type: ignore[arg-type]
    out.block("stdout", records.record(nonce, "progress", "1", " 40%|####") + "[default0]:plain\n")
    out.block("stdout", "[default1]:\r 40%|####\r100%|##########\n[default0]:ok\r\nreal\r[other:9] x\n")
    assert [line.split(maxsplit=1) for line in shown.getvalue().splitlines()] == [
        ["[a:0]", "plain"],
        ["[a:1]", "40%|####"],
        ["[a:1]", "100%|##########"],
        ["[a:0]", "ok"],
        ["[a]", "[other:9] x"],
    ]
    assert "\r 40%|####\r100%" in "".join(kept)

"""Every line of every rank exactly once (issue 17 item 1): print() from 2 ranks per node at full speed.

torchrun's --tee glued one rank's line to another's under load (0-35 of 160,000 lines per run), always
mangled a line written in two parts, and always glued a rank's last line without a newline to the other
local rank's next one. The training script here does all three with plain print(), and every line is
checked by its sequence number in the terminal output, the controller's log and the node's log.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.cluster import NamespaceCluster
from tests.conftest import CliRun, write_inventory

Bootstrap = Callable[..., CliRun]
LINES = 15_000  # per rank; 6 ranks

PRINTER = """\
import os, sys
rank = int(os.environ["RANK"])
for i in range({lines}):
    if i % 997 == 0:  # one line in two writes (progress output does this)
        sys.stdout.write("SEQ %d %d " % (rank, i)); sys.stdout.flush(); sys.stdout.write("half\\n")
    elif i % 101 == 0:
        print("SEQ %d %d @@ like a protocol marker \u00e9\u6f22\u5b57" % (rank, i))
    elif i % 50 == 0:
        print("SEQ %d %d %s" % (rank, i, "L" * 3000), file=sys.stderr)  # long, and on stderr
    else:
        print("SEQ %d %d %s" % (rank, i, "p" * (i % 40)))
sys.stdout.write("END %d without newline" % rank)
"""

_SEQ = re.compile(r"SEQ (\d+) (\d+) (.*)")


def _expected_tail(rank: int, i: int) -> str:
    if i % 997 == 0:
        return "half"
    if i % 101 == 0:
        return "@@ like a protocol marker \u00e9\u6f22\u5b57"
    if i % 50 == 0:
        return "L" * 3000
    return "p" * (i % 40)


def _check(lines: dict[int, list[str]], where: str) -> None:
    """Per global rank: SEQ 0..LINES-1 exactly once, in order, each intact; then the unterminated END."""
    assert sorted(lines) == list(range(6)), f"{where}: ranks {sorted(lines)}"
    for rank, texts in lines.items():
        seqs = []
        for text in texts[:-1]:
            match = _SEQ.fullmatch(text)
            assert match is not None, f"{where}: rank {rank}: mangled line {text[:120]!r}"
            assert int(match.group(1)) == rank, f"{where}: rank {rank} shows rank {match.group(1)}'s line"
            i = int(match.group(2))
            assert match.group(3) == _expected_tail(rank, i), f"{where}: rank {rank} line {i} changed"
            seqs.append(i)
        assert seqs == list(range(LINES)), f"{where}: rank {rank}: lines lost, repeated or reordered"
        assert texts[-1] == f"END {rank} without newline", f"{where}: rank {rank} last: {texts[-1][:80]!r}"


def _by_rank(
    text: str, label: re.Pattern[str], to_rank: Callable[[re.Match[str]], int]
) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        match = label.match(line)
        if match is not None:
            out.setdefault(to_rank(match), []).append(line[match.end() :])
    return out


def test_print_from_two_ranks_per_node_arrives_line_for_line(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    script = tmp_path / "printer.py"
    script.write_text(PRINTER.format(lines=LINES))
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable, "nproc": 2}
        for h in cluster.hosts
    ]
    inv = write_inventory(
        tmp_path / "h.yaml", nodes, name="ns", master="node1", backend="gloo", train={"script": str(script)}
    )
    run_id = f"lines-{time.time_ns()}"
    run = bootstrap("-i", str(inv), "launch", "--run-id", run_id, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    # the terminal: [node:rank] text, global ranks
    _check(_by_rank(run.stdout, re.compile(r"\[node\d:(\d+)\] "), lambda m: int(m.group(1))), "terminal")
    first = {h.name: 2 * i for i, h in enumerate(cluster.hosts)}
    label = re.compile(r"\[default(\d+)\]:")
    controller: dict[int, list[str]] = {}
    node_logs: dict[int, list[str]] = {}
    for host in cluster.hosts:
        base = first[host.name]
        here = (tmp_path / "runs" / run_id / f"{host.name}.log").read_text(encoding="utf-8")
        controller.update(_by_rank(here, label, lambda m, b=base: b + int(m.group(1))))  # type: ignore[misc]
        there = Path(f"/root/cluster-bootstrap/runs/{run_id}/{host.name}/node.log").read_text(
            encoding="utf-8"
        )
        node_logs.update(_by_rank(there, label, lambda m, b=base: b + int(m.group(1))))  # type: ignore[misc]
        # the raw per-rank files are kept on the node
        raw = Path(f"/root/cluster-bootstrap/runs/{run_id}/{host.name}/ranks")
        assert sorted(p.name for p in raw.iterdir()) == ["rank-0-attempt-0.out", "rank-1-attempt-0.out"]
    _check(controller, "controller log")
    _check(node_logs, "node log")

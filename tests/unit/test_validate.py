"""The validation report: what the workers' lines mean to the user."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.steps.validate import ValidateReport, parse_sizes
from orchestrator.view import human_bytes


def _honest(report: ValidateReport, record: dict[str, Any]) -> None:
    """``record`` as the node that runs its rank sends it, on a line tagged with that rank."""
    rank = record.get("rank")
    rank = rank if isinstance(rank, int) else None
    report.feed(record, report.ranks.get(rank, "node1") if rank is not None else "node1", rank)


def _report() -> ValidateReport:
    ranks = {0: "node1", 1: "node1", 2: "node2", 3: "node3"}
    return ValidateReport(world_size=4, ranks=ranks)


def test_sizes_accept_binary_suffixes() -> None:
    assert parse_sizes("4K, 1M,64MiB,4096,1G") == (4096, 1 << 20, 64 << 20, 4096, 1 << 30)


@pytest.mark.parametrize("text", ["", "abc", "2", "4X"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_sizes(text)


def test_missing_ranks_reported_by_rank0_are_named_by_node() -> None:
    report = _report()
    for rank in range(4):
        _honest(report, {"kind": "start", "rank": rank, "torch": "2.13.0"})
    _honest(report, {"kind": "missing", "rank": 0, "ranks": [2, 3]})
    assert not report.ok
    assert report.never_joined() == [2, 3]
    assert report.describe_ranks(report.never_joined()) == "node2 (rank 2), node3 (rank 3)"
    assert report.describe_ranks([0, 1]) == "node1 (ranks 0, 1)"


def test_without_a_verdict_every_rank_that_did_not_join_is_missing() -> None:
    report = _report()
    _honest(report, {"kind": "joined", "rank": 0, "seconds": 0.1})
    assert report.never_joined() == [1, 2, 3]


def test_a_complete_run_is_ok_and_keeps_the_timings() -> None:
    report = _report()
    for rank in range(4):
        _honest(report, {"kind": "joined", "rank": rank, "seconds": 0.2})
        _honest(report, {"kind": "correct", "rank": rank, "ok": True})
    _honest(
        report,
        {
            "kind": "result",
            "rank": 0,
            "bytes": 4096,
            "iters": 10,
            "latency_s": 1e-3,
            "algbw": 4.1e6,
            "busbw": 6e6,
        },
    )
    assert report.ok and report.never_joined() == []
    assert report.public_dict()["all_reduce"][0]["busbw"] == 6e6


def test_one_wrong_result_fails_the_whole_check() -> None:
    report = _report()
    for rank in range(4):
        _honest(report, {"kind": "joined", "rank": rank})
        _honest(report, {"kind": "correct", "rank": rank, "ok": rank != 2})
    assert report.correct is False and not report.ok


def test_lines_without_a_rank_are_ignored() -> None:
    report = _report()
    _honest(report, {"kind": "missing", "ranks": [1]})
    assert report.missing == []


def test_human_bytes() -> None:
    assert human_bytes(512) == "512 B"
    assert human_bytes(4096) == "4 KiB"
    assert human_bytes(1.5 * (1 << 20)) == "1.5 MiB"
    assert human_bytes(1048535) == "1 MiB"  # 1023.96 KiB, as it would show: the next unit


def test_a_node_cannot_blame_another_nodes_rank() -> None:
    # node3 (rank 3) prints a record in rank 0's name, on its own rank's line or with no rank tag
    report = _report()
    report.feed({"kind": "unreachable", "rank": 0, "master": "m:29500", "error": "refused"}, "node3", 3)
    report.feed({"kind": "unreachable", "rank": 0, "master": "m:29500", "error": "refused"}, "node3", None)
    # ... and on a line tagged as rank 0, which node3 does not run
    report.feed({"kind": "missing", "rank": 0, "ranks": [1, 2]}, "node3", 0)
    assert report.unreachable == {} and report.missing == []
    assert report.forged == {"node3": 3}
    # its own rank's records count
    report.feed({"kind": "unreachable", "rank": 3, "master": "m:29500", "error": "refused"}, "node3", 3)
    assert report.unreachable == {3: "m:29500: refused"}
    assert report.public_dict()["forged_records"] == {"node3": 3}
    assert "forged_records" not in _report().public_dict()

"""`shares: measured` on the namespace cluster with one slow host (node3 gets a quarter of one CPU:
bench_support.throttled): the example trains with ``shares: equal`` and ``shares: measured`` in the
same test; with measured shares node3's compute time per step drops and the cluster's steps/s rises, by
a clear margin; its loss curve matches one process over the same global batches either way.

All hosts share this machine's cores (and other work on it): every assertion compares runs made side
by side (a direction and a margin), never an absolute time. The probe itself: test_bench_probe.py; the
scaling report: test_bench_scaling.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import NamespaceCluster
from tests.conftest import CliRun
from tests.e2e.bench_support import (
    BATCH,
    STEPS,
    TRAIN,
    bench_inventory,
    favoured,
    losses,
    metrics,
    reference_losses,
    summary,
    throttled,
)

Bootstrap = Callable[..., CliRun]


def _steps_per_s(records: list[dict[str, Any]]) -> float:
    """The cluster's steps per second in one training: its slowest node sets the pace."""
    return 1 / max(summary(records, n)["step_time"] for n in ("node1", "node2", "node3"))


@pytest.mark.timeout(1800)
def test_measured_shares_train_faster_with_the_same_loss(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    reference = reference_losses(tmp_path)
    node1, node2, node3 = cluster.hosts
    # The comparison needs node3 to be the bottleneck: beside other tests loading this machine's two
    # cores, node1 and node2 could be as slow (a CI run beside 3 workers once measured equal shares
    # faster than measured ones). So all three hosts outweigh everything else here (bench_support:
    # cgroup CPU weights), and node3 is capped at a quarter of a CPU.
    with favoured(node1), favoured(node2), throttled(node3, favoured=True):
        # training with equal and with measured shares, one after the other: on a quiet machine
        # measured shares make about 1.6x the steps/s of equal ones here, the assertion below asks
        # for 1.25x. A second pair only when the first did not show it (a CI run once measured both
        # at the same 24 steps/s, with node3 computing half as long per step: something else on the
        # machine set the pace of that pair)
        runs: dict[str, list[list[dict[str, Any]]]] = {"equal": [], "measured": []}
        for _ in range(2):
            for mode in ("equal", "measured"):
                inv = bench_inventory(
                    cluster, tmp_path / f"{mode}.yaml", args=[*TRAIN, "--max-steps", str(STEPS)], shares=mode
                )
                launched = bootstrap("-i", str(inv), "launch", cwd=tmp_path, timeout=600)
                assert launched.returncode == 0, str(launched)
                said = rf"^\[node1:0\] \[rank 0/3\] shares {mode} \(from .*\): \[(\d+), (\d+), (\d+)\] of"
                shown = re.search(said, launched.stdout, re.M)
                assert shown, launched.stdout
                runs[mode].append(metrics(launched))
            steps_per_s = {mode: [_steps_per_s(r) for r in rounds] for mode, rounds in runs.items()}
            pairs = list(zip(steps_per_s["equal"], steps_per_s["measured"], strict=True))
            if any(measured > 1.25 * equal for equal, measured in pairs):
                break
    node3_compute = {
        mode: [summary(r, "node3")["compute_time"] for r in rounds] for mode, rounds in runs.items()
    }
    print(f"steps/s {steps_per_s}; node3 compute s/step {node3_compute}")
    equal_shares = summary(runs["equal"][0], "node3")["shares"]
    measured_shares = summary(runs["measured"][0], "node3")["shares"]
    assert equal_shares == [BATCH] * 3 and measured_shares[2] < BATCH // 2, measured_shares
    # node3 spends much less of each step computing; the cluster makes more steps per second
    assert min(node3_compute["measured"]) < 0.7 * min(node3_compute["equal"]), node3_compute
    assert any(measured > 1.25 * equal for equal, measured in pairs), steps_per_s
    # the same training either way: the loss curve of one process over the same global batches
    for mode, rounds in runs.items():
        for records in rounds:
            curve = losses(records)
            assert sorted(curve) == sorted(reference) == list(range(10, STEPS + 1, 10)), (mode, curve)
            for step, value in reference.items():
                assert curve[step] == pytest.approx(value, abs=2e-4), (mode, step, curve, reference)

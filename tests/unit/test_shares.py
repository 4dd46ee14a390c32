"""Share arithmetic: integers that sum to the global batch, none zero, proportional, stable."""

from __future__ import annotations

import ast
import json
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.bench import cb_shares
from orchestrator.bench.shares import (
    SharesDoc,
    SharesError,
    doc_for_setting,
    equal_shares,
    fixed_weights,
    loss_scale,
    split_batch,
)
from orchestrator.resources import package_file

weights_st = st.lists(
    st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False), min_size=1, max_size=24
)


@st.composite
def batch_and_weights(draw: st.DrawFn) -> tuple[int, list[float]]:
    weights = draw(weights_st)
    total = draw(st.integers(min_value=len(weights), max_value=100_000))
    return total, weights


@given(batch_and_weights())
@settings(max_examples=300, deadline=None)
def test_shares_sum_exactly_and_no_rank_gets_zero(case: tuple[int, list[float]]) -> None:
    total, weights = case
    shares = split_batch(total, weights)
    assert sum(shares) == total
    assert all(isinstance(s, int) and s >= 1 for s in shares)
    assert len(shares) == len(weights)


@given(batch_and_weights())
@settings(max_examples=300, deadline=None)
def test_each_share_is_within_one_of_its_quota_unless_raised_to_one(case: tuple[int, list[float]]) -> None:
    total, weights = case
    shares = split_batch(total, weights)
    raised = [
        i for i, w in enumerate(weights) if Fraction(total) * Fraction(w) / sum(map(Fraction, weights)) < 1
    ]
    if not raised:  # plain largest remainder: floor or ceiling of the exact quota
        exact = [Fraction(total) * Fraction(w) / sum(map(Fraction, weights)) for w in weights]
        assert all(q - 1 < s < q + 1 for s, q in zip(shares, exact, strict=True)), (shares, exact)


@given(batch_and_weights())
@settings(max_examples=300, deadline=None)
def test_a_faster_rank_never_gets_less(case: tuple[int, list[float]]) -> None:
    total, weights = case
    shares = split_batch(total, weights)
    for i, wi in enumerate(weights):
        for j, wj in enumerate(weights):
            if wi > wj:
                assert shares[i] >= shares[j], (weights, shares)


@given(batch_and_weights(), st.sampled_from([2.0, 0.5, 3.0, 1024.0]))
@settings(max_examples=200, deadline=None)
def test_scaling_every_weight_changes_nothing(case: tuple[int, list[float]], factor: float) -> None:
    total, weights = case
    assert split_batch(total, [w * factor for w in weights]) == split_batch(total, weights)


@given(batch_and_weights(), st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_reordering_ranks_reorders_their_shares(case: tuple[int, list[float]], rnd: object) -> None:
    total, weights = case
    distinct = list(dict.fromkeys(weights))  # ties are broken by rank: only distinct weights here
    if len(distinct) < len(weights):
        weights = distinct
        total = max(total, len(weights))
    order = list(range(len(weights)))
    rnd.shuffle(order)  # type: ignore[attr-defined]
    shares = split_batch(total, weights)
    permuted = split_batch(total, [weights[i] for i in order])
    assert permuted == [shares[i] for i in order]


def test_the_same_input_always_gives_the_same_shares() -> None:
    weights = [812.25, 790.5, 201.125, 790.5]
    first = split_batch(257, weights)
    assert first == [81, 78, 20, 78]  # quotas 80.46, 78.31, 19.92, 78.31
    assert all(split_batch(257, list(weights)) == first for _ in range(20))
    # ranks 1 and 3 are equally fast: an odd sample between them goes to the lower rank
    assert split_batch(258, weights) == [81, 79, 20, 78]


def test_ties_go_to_the_lower_rank_and_equal_shares_are_todays_split() -> None:
    assert equal_shares(10, 4) == [3, 3, 2, 2]
    assert equal_shares(256, 3) == [86, 85, 85]  # 256 // 3 + (1 if rank < 256 % 3 else 0)
    assert split_batch(7, [1, 1, 1]) == [3, 2, 2]


def test_worked_example() -> None:
    # speeds 3:1 over 100 samples: 75 and 25; a rank 50x slower still gets one sample
    assert split_batch(100, [3.0, 1.0]) == [75, 25]
    assert split_batch(10, [100.0, 100.0, 1.0]) == [5, 4, 1]
    assert split_batch(3, [1e6, 1e6, 1e-3]) == [1, 1, 1]


def test_a_rank_below_one_sample_is_raised_and_the_others_keep_their_proportion() -> None:
    shares = split_batch(20, [1000.0, 500.0, 1.0])
    assert shares[2] == 1 and sum(shares) == 20
    assert shares[:2] == split_batch(19, [1000.0, 500.0])


@pytest.mark.parametrize(
    ("total", "weights", "words"),
    [
        (2, [1, 1, 1], "cannot give each of 3 ranks 1 sample"),
        (10, [], "no ranks"),
        (10, [1, 0], "rank 1: weight 0 must be > 0"),
        (10, [1, -2.5], "rank 1: weight -2.5 must be > 0"),
        (10, [1, float("nan")], "rank 1: weight nan is not a finite number"),
        (10, [1, float("inf")], "is not a finite number"),
        (10, [True, 1], "rank 0: weight True is not a finite number"),
        (10.0, [1, 1], "must be an integer"),
    ],
)
def test_bad_input_is_refused_with_its_reason(total: object, weights: list[object], words: str) -> None:
    with pytest.raises(SharesError, match=words):
        split_batch(total, weights)  # type: ignore[arg-type]


def test_loss_scale() -> None:
    assert loss_scale(64, 192, 3) == 1.0
    assert loss_scale(10, 40, 2) == 0.5
    assert sum(loss_scale(n, 100, 3) for n in (70, 20, 10)) == pytest.approx(3.0)
    with pytest.raises(SharesError):
        loss_scale(1, 0, 1)


def test_fixed_list_per_rank_or_per_node() -> None:
    nprocs = [2, 1, 1]  # 3 nodes, 4 ranks
    assert fixed_weights([10, 20, 30, 40], nprocs) == [10, 20, 30, 40]
    assert fixed_weights([101, 20, 30], nprocs) == [51, 50, 20, 30]
    with pytest.raises(SharesError, match=r"2 number\(s\), but the cluster has 3 node\(s\) and 4 rank\(s\)"):
        fixed_weights([1, 2], nprocs)
    with pytest.raises(SharesError, match="less than that node's 2 ranks"):
        fixed_weights([1, 20, 30], nprocs)
    with pytest.raises(SharesError, match="item 2"):
        fixed_weights([1, 0, 3, 4], nprocs)


def test_documents_for_each_setting_read_back_by_the_helper(tmp_path: Path) -> None:
    nodes = [("a", 2), ("b", 1)]
    equal = doc_for_setting("equal", nodes)
    assert equal is not None and equal.shares is None and equal.weights == [1.0, 1.0, 1.0]
    assert [r["node"] for r in equal.ranks] == ["a", "a", "b"]
    fixed = doc_for_setting([30, 10], nodes)
    assert fixed is not None and fixed.shares == [15, 15, 10]
    assert doc_for_setting("measured", nodes) is None
    measured = SharesDoc.measured([900.0, 850.0, 120.0], global_batch=192, measured_at="2026-12-03T12:00:00Z")
    for doc in (equal, fixed, measured):
        path = tmp_path / f"{doc.mode}.json"
        path.write_text(doc.to_json())
        read = cb_shares.load_shares(3, str(path))
        assert read.mode == doc.mode
        for batch in (3, 40, 192, 1000):
            assert read.for_batch(batch) == doc.for_batch(batch)
    assert measured.shares == split_batch(192, [900.0, 850.0, 120.0]) and sum(measured.shares) == 192
    assert cb_shares.load_shares(3, str(tmp_path / "measured.json")).measured_at == "2026-12-03T12:00:00Z"


def test_no_file_means_equal_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cb_shares.FILE_ENV, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "3")
    shares = cb_shares.load_shares()
    assert shares.mode == "equal" and shares.source == "" and shares.for_batch(192) == [64, 64, 64]
    assert "no CB_SHARES_FILE" in shares.describe()


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"format": 2}, "format 2, this helper reads format 1"),
        ({"mode": "fast"}, "mode 'fast' is not one of"),
        ({"world_size": 2}, "written for a world of 2 rank(s), but this run has 3"),
        ({"weights": [1, 2]}, "weights must be a list of 3 numbers"),
        ({"weights": [1, 2, -1]}, "rank 2: weight -1 must be > 0"),
        ({"shares": [1, 2, 0], "global_batch": 3}, "shares must be a list of 3 integers >= 1"),
        ({"shares": [1, 2, 3], "global_batch": 7}, "global_batch 7 is not the sum of the shares"),
    ],
)
def test_a_wrong_file_is_an_error_naming_it(tmp_path: Path, doc: dict[str, object], words: str) -> None:
    good = SharesDoc.fixed([1, 2, 3]).document()
    path = tmp_path / "cb_shares.json"
    path.write_text(json.dumps({**good, **doc}))
    with pytest.raises(cb_shares.SharesError) as caught:
        cb_shares.load_shares(3, str(path))
    assert words in str(caught.value) and str(path) in str(caught.value)


def test_a_named_file_that_is_missing_is_an_error_not_equal_shares(tmp_path: Path) -> None:
    with pytest.raises(cb_shares.SharesError, match="cannot read it"):
        cb_shares.load_shares(2, str(tmp_path / "gone.json"))


def test_the_helper_imports_nothing_but_the_standard_library_and_torch() -> None:
    """It runs on nodes that do not have cluster-bootstrap installed."""
    import sys

    source = package_file("bench/cb_shares.py").read_text()
    tree = ast.parse(source)
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports: the file is loaded on its own"
            imported.add((node.module or "").split(".")[0])
    assert imported - set(sys.stdlib_module_names) <= {"torch", "__future__"}, imported
    top_level = {
        (n.names[0].name if isinstance(n, ast.Import) else n.module or "").split(".")[0]
        for n in tree.body
        if isinstance(n, (ast.Import, ast.ImportFrom))
    }
    assert "torch" not in top_level, "torch is imported where it is used: the controller reads this file too"

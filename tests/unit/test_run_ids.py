"""Run ids: one run each. Ids bootstrap picks never collide; ids a user picks are refused when taken."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.steps import runs


def test_launches_within_one_second_get_their_own_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runs.time, "strftime", lambda _fmt: "20261203-010203")
    first = runs.pick_run_id("lab", tmp_path)
    assert first == "lab-20261203-010203"
    (tmp_path / first).mkdir()  # the first launch's record directory
    second = runs.pick_run_id("lab", tmp_path)
    (tmp_path / second).mkdir()
    third = runs.pick_run_id("lab", tmp_path)
    assert (second, third) == ("lab-20261203-010203-2", "lab-20261203-010203-3")


def test_a_chosen_id_is_refused_when_a_run_of_it_was_launched_here(tmp_path: Path) -> None:
    assert runs.claim_run_id("exp-1", tmp_path) == "exp-1"
    (tmp_path / "exp-1").mkdir()
    assert runs.claim_run_id("exp-1", tmp_path) == "exp-1"  # a directory without a record: `logs` copies
    (tmp_path / "exp-1" / runs.RECORD).write_text("{}")
    with pytest.raises(UsageError, match=r"run exp-1 already exists here") as caught:
        runs.claim_run_id("exp-1", tmp_path)
    assert "--run-id" in (caught.value.hint or "")
    with pytest.raises(UsageError, match="invalid run id"):
        runs.claim_run_id("../etc", tmp_path)

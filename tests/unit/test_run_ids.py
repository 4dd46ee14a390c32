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
    ids = [runs.pick_run_id("lab", tmp_path) for _ in range(3)]
    assert ids == ["lab-20261203-010203", "lab-20261203-010203-2", "lab-20261203-010203-3"]
    assert all((tmp_path / i).is_dir() for i in ids)  # reserved at once: a concurrent launch gets the next
    # --dry-run reserves nothing
    assert runs.pick_run_id("lab", tmp_path, reserve=False) == "lab-20261203-010203-4"
    assert not (tmp_path / "lab-20261203-010203-4").exists()


def test_a_cluster_name_of_free_text_gives_an_id_every_run_command_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runs.time, "strftime", lambda _fmt: "20261203-010203")
    assert runs.pick_run_id("GPU lab/2 (Jo’s)", tmp_path) == "GPU-lab-2-Jo-s-20261203-010203"
    assert runs.pick_run_id("validate-GPU lab", tmp_path).startswith("validate-GPU-lab-")
    assert runs.pick_run_id("…", tmp_path) == "run-20261203-010203"
    assert [p.name for p in tmp_path.iterdir() if "/" in p.name] == []


def test_latest_is_the_newest_launch_from_here_before_any_copy(tmp_path: Path) -> None:
    import os

    (tmp_path / "old-launch").mkdir()
    (tmp_path / "old-launch" / runs.RECORD).write_text("{}")
    os.utime(tmp_path / "old-launch" / runs.RECORD, (1000, 1000))
    (tmp_path / "copied-by-logs").mkdir()  # newer, but only a copy of a run launched elsewhere
    assert runs.resolve_run("latest", tmp_path) == "old-launch"
    (tmp_path / "new-launch").mkdir()
    (tmp_path / "new-launch" / runs.RECORD).write_text("{}")
    assert runs.resolve_run(None, tmp_path) == "new-launch"


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

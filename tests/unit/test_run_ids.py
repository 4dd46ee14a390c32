"""Run ids: one run each. Ids bootstrap picks never collide; ids a user picks are refused when taken."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.runs import ids
from orchestrator.runs.layout import RECORD


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ids.time, "strftime", lambda _fmt: "20261203-010203")


@pytest.mark.usefixtures("frozen")
def test_launches_within_one_second_get_their_own_ids(tmp_path: Path) -> None:
    picked = [ids.new_run_id("lab", root=tmp_path) for _ in range(3)]
    assert picked == ["lab-20261203-010203", "lab-20261203-010203-2", "lab-20261203-010203-3"]
    assert all((tmp_path / i).is_dir() for i in picked)  # reserved at once: a concurrent launch gets the next
    # --dry-run and render reserve nothing
    assert ids.new_run_id("lab", root=tmp_path, reserve=False) == "lab-20261203-010203-4"
    assert not (tmp_path / "lab-20261203-010203-4").exists()


@pytest.mark.usefixtures("frozen")
def test_every_kind_of_run_has_the_same_scheme(tmp_path: Path) -> None:
    assert ids.new_run_id("lab", kind="validate", root=tmp_path) == "validate-lab-20261203-010203"
    assert ids.new_run_id("lab", kind="run", root=tmp_path) == "run-lab-20261203-010203"
    # the validation and the launch of one second do not take each other's id
    assert ids.new_run_id("lab", root=tmp_path) == "lab-20261203-010203"


@pytest.mark.usefixtures("frozen")
def test_a_cluster_name_of_free_text_gives_an_id_every_run_command_accepts(tmp_path: Path) -> None:
    assert ids.new_run_id("GPU lab/2 (Jo’s)", root=tmp_path) == "GPU-lab-2-Jo-s-20261203-010203"
    assert ids.new_run_id("GPU lab", kind="validate", root=tmp_path).startswith("validate-GPU-lab-")
    assert ids.new_run_id("…", root=tmp_path) == "run-20261203-010203"
    assert [p.name for p in tmp_path.iterdir() if "/" in p.name] == []
    for picked in (p.name for p in tmp_path.iterdir()):
        assert ids.check_run_id(picked) == picked


def test_latest_is_the_newest_launch_from_here_before_any_copy(tmp_path: Path) -> None:
    (tmp_path / "old-launch").mkdir()
    (tmp_path / "old-launch" / RECORD).write_text("{}")
    os.utime(tmp_path / "old-launch" / RECORD, (1000, 1000))
    (tmp_path / "copied-by-logs").mkdir()  # newer, but only a copy of a run launched elsewhere
    assert ids.resolve_run("latest", tmp_path) == "old-launch"
    (tmp_path / "new-launch").mkdir()
    (tmp_path / "new-launch" / RECORD).write_text("{}")
    assert ids.resolve_run(None, tmp_path) == "new-launch"


def test_latest_is_the_newest_launch_whatever_wrote_an_older_record_since(tmp_path: Path) -> None:
    """`stop --run` of an older run writes its record again (the stop is noted there): latest was
    the record written last, so that older run became `latest` for status, logs, fetch and stop."""
    for name, started in (("older", 100.0), ("newer", 200.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / RECORD).write_text(f'{{"started": {started}}}')
    os.utime(tmp_path / "newer" / RECORD, (1000, 1000))
    os.utime(tmp_path / "older" / RECORD, (2000, 2000))  # noted a stop later
    assert ids.resolve_run("latest", tmp_path) == "newer"


def test_latest_says_so_when_a_newer_launch_never_started(tmp_path: Path) -> None:
    """A refused (or cut short) launch is never `latest`: status, logs, fetch and stop then took the
    run before it silently, its state read as the new one's. They still take it, and say why."""
    (tmp_path / "ran").mkdir()
    (tmp_path / "ran" / RECORD).write_text("{}")
    os.utime(tmp_path / "ran" / RECORD, (1000, 1000))
    notes: list[str] = []
    assert ids.resolve_run("latest", tmp_path, on_note=notes.append) == "ran" and notes == []
    (tmp_path / "refused").mkdir()
    (tmp_path / "refused" / RECORD).write_text('{"not_started": true}')
    assert ids.resolve_run("latest", tmp_path, on_note=notes.append) == "ran"
    assert notes == [
        "latest is run ran: the newer launch refused never started (refused, or cut short before "
        "training began)"
    ]
    notes.clear()
    assert ids.resolve_run("ran", tmp_path, on_note=notes.append) == "ran" and notes == []  # asked by name


def test_a_chosen_id_is_refused_when_a_run_of_it_was_launched_here(tmp_path: Path) -> None:
    assert ids.new_run_id("lab", chosen="exp-1", root=tmp_path) == "exp-1"
    (tmp_path / "exp-1").mkdir()
    assert ids.claim_run_id("exp-1", tmp_path) == "exp-1"  # a directory without a record: `logs` copies
    (tmp_path / "exp-1" / RECORD).write_text("{}")
    with pytest.raises(UsageError, match=r"run exp-1 already exists here") as caught:
        ids.new_run_id("lab", chosen="exp-1", root=tmp_path)
    assert "--run-id" in (caught.value.hint or "")
    # render names a run without starting it: an existing one is fine, a bad one is not
    assert ids.new_run_id("lab", chosen="exp-1", root=tmp_path, reserve=False) == "exp-1"
    for reserve in (True, False):
        with pytest.raises(UsageError, match="invalid run id"):
            ids.new_run_id("lab", chosen="../etc", root=tmp_path, reserve=reserve)


def test_latest_is_no_run_id_since_run_latest_names_the_newest_run(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="'latest' is reserved"):
        ids.check_run_id("latest")
    with pytest.raises(UsageError, match="'latest' is reserved"):
        ids.claim_run_id("latest", tmp_path)
    assert not (tmp_path / "latest").exists()
    assert ids.check_run_id("latest-1") == "latest-1"


def test_the_runs_before_are_the_launches_before_it_here_newest_first(tmp_path: Path) -> None:
    for name, when in (("first", 1000), ("second", 2000), ("third", 3000)):
        (tmp_path / name).mkdir()
        (tmp_path / name / RECORD).write_text("{}")
        os.utime(tmp_path / name / RECORD, (when, when))
    (tmp_path / "copied-by-logs").mkdir()  # no record: not a run launched here
    (tmp_path / "never").mkdir()  # a launch that started nowhere
    (tmp_path / "never" / RECORD).write_text('{"not_started": true}')
    os.utime(tmp_path / "never" / RECORD, (2500, 2500))
    assert ids.runs_before("third", tmp_path) == ["second", "first"]
    assert ids.runs_before("third", tmp_path, most=1) == ["second"]
    assert ids.runs_before("second", tmp_path) == ["first"]
    assert ids.runs_before("first", tmp_path) == []
    assert ids.runs_before("elsewhere", tmp_path) == []


def test_a_mistyped_run_id_is_met_with_the_nearest_run_here(tmp_path: Path) -> None:
    for name in ("lab-20261207-140511", "lab-20261207-153000"):
        (tmp_path / name).mkdir()
        (tmp_path / name / RECORD).write_text("{}")
    assert ids.nearest_run("lab-20261207-14051", tmp_path) == "lab-20261207-140511"
    assert ids.nearest_run("lab-20261207-140511", tmp_path) is None  # that run itself: no typo
    assert ids.nearest_run("nope", tmp_path) is None

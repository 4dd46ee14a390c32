"""The controller's copies of node output (orchestrator.logs.RunLog): readable while a run goes, and
`bootstrap logs` (staged) replacing a copy only with a read that succeeded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from orchestrator.logs import BUSY, KEPT, REPLACED, RunLog


def test_each_block_is_on_disk_before_close_for_another_reader(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "runs" / "r1")
    log.write_block("n1", "[default0]:step 1\n[default0]:step 2\n")
    log.write("n1", "torchrun: waiting")
    # another process (tail -f, a crash right now) sees every line written so far
    seen = subprocess.run(
        [sys.executable, "-c", "import sys; print(open(sys.argv[1]).read(), end='')", str(log.path("n1"))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert seen == "[default0]:step 1\n[default0]:step 2\ntorchrun: waiting\n"
    log.write_block("n1", "more\n")
    assert log.path("n1").read_text().endswith("waiting\nmore\n")
    log.close()
    assert (log.path("n1").stat().st_mode & 0o777) == 0o600


def _old_copy(tmp_path: Path, text: bytes = b"old line 1\nold line 2\n") -> RunLog:
    log = RunLog(tmp_path / "runs" / "r1", staged=True)
    log.directory.mkdir(parents=True)
    log.path("n1").write_bytes(text)
    return log


def test_staged_blocks_go_to_the_part_and_replace_the_copy_only_on_commit(tmp_path: Path) -> None:
    log = _old_copy(tmp_path)
    log.write_block("n1", "new 1\n")
    log.write_block("n1", "new 2\nnew 3\n")
    assert log.path("n1").read_bytes() == b"old line 1\nold line 2\n"  # untouched while reading
    assert log.part_path("n1").read_text() == "new 1\nnew 2\nnew 3\n"  # flushed there as it comes
    assert log.commit("n1") == REPLACED
    assert log.path("n1").read_text() == "new 1\nnew 2\nnew 3\n"
    assert not log.part_path("n1").exists()
    assert log.commit("n1") == KEPT  # settled once (Ctrl-C while settling the others): not blanked
    assert log.path("n1").read_text() == "new 1\nnew 2\nnew 3\n"
    log.write_block("n1", "late block from a worker thread\n")  # after the commit: dropped
    log.close()
    assert log.path("n1").read_text() == "new 1\nnew 2\nnew 3\n" and not log.part_path("n1").exists()


def test_a_failed_read_keeps_the_copy_byte_for_byte(tmp_path: Path) -> None:
    old = b"old \xc3\xa9 line\nno newline at the end"
    log = _old_copy(tmp_path, old)
    log.write_block("n1", "half of what the node had\n")
    log.discard("n1")
    log.close()
    assert log.path("n1").read_bytes() == old and not log.part_path("n1").exists()
    # closing without a commit (an exception on the way out) keeps it too
    again = RunLog(log.directory, staged=True)
    again.write_block("n1", "x\n")
    again.close()
    assert log.path("n1").read_bytes() == old and not log.part_path("n1").exists()


def test_a_read_cut_short_replaces_the_copy_only_when_it_is_longer(tmp_path: Path) -> None:
    log = _old_copy(tmp_path, b"a\nb\nc\n")
    log.write_block("n1", "a\nb\n")
    assert log.commit("n1", only_if_longer=True) == KEPT
    assert log.path("n1").read_bytes() == b"a\nb\nc\n" and not log.part_path("n1").exists()
    longer = RunLog(log.directory, staged=True)
    longer.write_block("n1", "a\nb\nc\nd\n")
    assert longer.commit("n1", only_if_longer=True) == REPLACED
    assert log.path("n1").read_bytes() == b"a\nb\nc\nd\n"
    nothing = RunLog(log.directory, staged=True)  # cut before anything arrived
    assert nothing.commit("n1", only_if_longer=True) == KEPT
    assert log.path("n1").read_bytes() == b"a\nb\nc\nd\n"
    fresh = RunLog(tmp_path / "runs" / "r2", staged=True)  # no copy yet: any prefix is more
    fresh.write_block("n1", "a\n")
    assert fresh.commit("n1", only_if_longer=True) == REPLACED
    assert fresh.path("n1").read_bytes() == b"a\n"


def test_a_successful_read_of_an_empty_log_makes_the_copy_empty(tmp_path: Path) -> None:
    log = _old_copy(tmp_path)
    assert log.commit("n1") == REPLACED
    assert log.path("n1").read_bytes() == b"" and not log.part_path("n1").exists()
    elsewhere = RunLog(tmp_path / "other" / "runs" / "r1", staged=True)  # no directory yet
    assert elsewhere.commit("n1") == REPLACED and elsewhere.path("n1").read_bytes() == b""


def test_a_copy_a_running_launch_writes_is_left_to_it(tmp_path: Path) -> None:
    launch = RunLog(tmp_path / "runs" / "r1")  # a foreground launch, still writing
    launch.write_block("n1", "line 1\n")
    logs = RunLog(launch.directory, staged=True)
    logs.write_block("n1", "line 1\n")
    assert logs.commit("n1") == BUSY
    assert not logs.part_path("n1").exists()
    launch.write_block("n1", "line 2\n")  # still lands in the file everyone reads
    assert launch.path("n1").read_text() == "line 1\nline 2\n"
    launch.close()
    after = RunLog(launch.directory, staged=True)  # the launch has ended: replaced as usual
    after.write_block("n1", "line 1\nline 2\n")
    assert after.commit("n1") == REPLACED


def test_a_second_logs_of_the_same_run_writes_no_part_of_its_own(tmp_path: Path) -> None:
    first = _old_copy(tmp_path)
    second = RunLog(first.directory, staged=True)
    first.write_block("n1", "from the first\n")
    second.write_block("n1", "from the second\n")  # the part is the first one's: nothing written
    assert second.busy("n1") and not first.busy("n1")
    assert first.part_path("n1").read_text() == "from the first\n"
    assert second.commit("n1") == BUSY
    assert first.commit("n1") == REPLACED
    assert first.path("n1").read_text() == "from the first\n"
    second.close()
    assert first.path("n1").read_text() == "from the first\n"


def test_a_part_left_by_a_killed_logs_is_started_over(tmp_path: Path) -> None:
    log = _old_copy(tmp_path)
    log.part_path("n1").write_text("stale, from a kill -9\n")
    log.write_block("n1", "fresh\n")
    assert log.commit("n1") == REPLACED
    assert log.path("n1").read_text() == "fresh\n"

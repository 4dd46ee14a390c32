"""The node's rank capture (steps/probes/rank_capture.py) on its own: how a rank file's bytes become
labelled lines. End to end (torchrun, ranks at full speed): tests/e2e/test_rank_lines.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from orchestrator.resources import package_file


def _capture() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "rank_capture", package_file("steps/probes/rank_capture.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_line_longer_than_the_limit_becomes_labelled_lines_of_the_limit(tmp_path: Path) -> None:
    """A rank printing 2.5 MiB without a newline (a progress bar drawn with \\r forever, a dump):
    memory stays bounded and every piece keeps its rank's label, so `logs` and the terminal never
    show a piece as another rank's or as nobody's."""
    rc = _capture()
    path = tmp_path / "rank-1-attempt-0.out"
    limit = rc.MAX_PARTIAL
    path.write_bytes(b"before\n" + b"x" * (2 * limit + limit // 2))
    f = rc.RankFile(str(path), "1", 0)
    lines = f.read().split(b"\n")
    assert lines[0] == b"[default1]:before"
    assert lines[1:3] == [b"[default1]:" + b"x" * limit] * 2 and lines[3] == b""
    with path.open("ab") as handle:
        handle.write(b"tail\nafter\n")
    assert f.read() == b"[default1]:" + b"x" * (limit // 2) + b"tail\n[default1]:after\n"
    assert f.finish() == b""

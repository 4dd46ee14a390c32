"""Node output is read through one codec (orchestrator/records.py): no other module of the package
writes or parses ``@@`` lines of its own. Allowed: the codec, the platforms' encoders (sh, PowerShell)
and the rank workers' copy of the Python encoder (shipped files that cannot import the package; the
copy is checked to be the codec's own below)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from orchestrator import records

PACKAGE = Path(records.__file__).parent

ALLOWED = {
    "records.py",
    "platforms/posix.py",
    "platforms/powershell.py",
    "steps/probes/validate_worker.py",
    "bench/probe_worker.py",
    "steps/probes/rank_capture.py",
}


def test_no_module_but_the_codec_and_the_encoders_holds_an_at_at_protocol() -> None:
    found = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "@@" in path.read_text(encoding="utf-8")
    )
    assert [f for f in found if f not in ALLOWED] == []


def test_the_workers_encoder_is_the_codecs() -> None:
    """The workers print their results with a copy of ``records.record``: the same code."""

    def encoder(source: str) -> str:
        (function,) = [
            n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "record"
        ]
        return ast.dump(function)

    codec = encoder(inspect.getsource(records))
    for worker in ("steps/probes/validate_worker.py", "bench/probe_worker.py"):
        assert encoder((PACKAGE / worker).read_text(encoding="utf-8")) == codec, worker

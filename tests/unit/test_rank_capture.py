"""The node's rank capture (steps/probes/rank_capture.py) on its own: how a rank file's bytes become
labelled lines. End to end (torchrun, ranks at full speed): tests/e2e/test_rank_lines.py."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from orchestrator import records
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


FAKE_SMI = Path(__file__).resolve().parents[1] / "data" / "nvidia_smi"
NONCE = "cb-0123456789ab"


def test_the_node_side_record_encoder_is_the_codecs() -> None:
    """rank_capture.py is uploaded alone (standard library only): its copy of the encoder must
    write exactly what orchestrator/records.py decodes."""
    mine = ast.parse(inspect.getsource(_capture().record))
    theirs = ast.parse(records.PYTHON_ENCODER)
    assert ast.dump(mine) == ast.dump(theirs)


def test_a_sample_is_the_gpus_nvidia_smi_reports_else_the_cpu_load(monkeypatch: pytest.MonkeyPatch) -> None:
    rc = _capture()
    monkeypatch.setenv("PATH", f"{FAKE_SMI}:/usr/bin:/bin")
    gpu = records.decode(rc.sample(NONCE), NONCE)
    assert gpu == [records.Record("gpu", (b"0, 87, 20513, 24576", b"1, 3, 1024, 24576"))]
    monkeypatch.setenv("CB_FAKE_GPU_NODE", "no-such-host")  # nvidia-smi fails: a broken driver
    (cpu,) = records.decode(rc.sample(NONCE), NONCE)
    assert cpu.kind == "cpu" and float(cpu.text(0)) >= 0 and int(cpu.text(1)) == os.cpu_count()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi at all
    assert records.decode(rc.sample(NONCE), NONCE)[0].kind == "cpu"


def test_mux_writes_the_samples_between_whole_lines(tmp_path: Path) -> None:
    """With CB_SAMPLE_NONCE, the samples reach the stream as records while the command runs (the
    first at once), never inside a line; without it, none."""
    go_on = tmp_path / "go-on"
    command = [
        sys.executable,
        "-c",
        f"import os, time\nwhile not os.path.exists({str(go_on)!r}): time.sleep(0.01)",
    ]
    env = {**os.environ, "PATH": f"{FAKE_SMI}:/usr/bin:/bin", "CB_SAMPLE_NONCE": NONCE}
    script = str(package_file("steps/probes/rank_capture.py"))
    with subprocess.Popen(
        [sys.executable, script, "mux", str(tmp_path / "ranks"), *command], stdout=subprocess.PIPE, env=env
    ) as mux:
        assert mux.stdout is not None
        first = mux.stdout.readline().decode()  # the first sample, before the command ends
        go_on.touch()
        rest = mux.stdout.read().decode()
    assert mux.returncode == 0
    assert records.decode(first, NONCE) == [
        records.Record("gpu", (b"0, 87, 20513, 24576", b"1, 3, 1024, 24576"))
    ]
    assert records.plain(rest, NONCE).strip() == ""
    del env["CB_SAMPLE_NONCE"]
    quiet = subprocess.run(
        [sys.executable, script, "mux", str(tmp_path / "ranks2"), sys.executable, "-c", "print('hi')"],
        capture_output=True,
        env=env,
        check=True,
    )
    assert quiet.stdout == b"hi\n"

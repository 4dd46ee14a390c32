"""The torch probe's cache (orchestrator/facts/probes/torch_facts.py), run as `check` runs it on a
node: under a Python with torch, `-c` the probe's text. The first answer imports torch and is
written to the cache; the next ones print the cached line as it is (no json import); a half-written
cache file is never printed, the probe asks torch again and rewrites it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

PROBE = resources.files("orchestrator.facts.probes").joinpath("torch_facts.py").read_text()


def _probe(cache_home: Path) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-S", "-c", PROBE],  # as check starts it (facts/linux.py interpreter_probe)
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "XDG_CACHE_HOME": str(cache_home)},
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    # the interpreter's path and version (the Python fact), then the one line the torch fact reads
    assert len(lines) == 3 and lines[1] == ".".join(map(str, sys.version_info[:3])), out.stdout
    answer = json.loads(lines[2])
    assert isinstance(answer, dict)
    return answer


def test_the_second_answer_comes_from_the_cache_and_a_broken_cache_is_asked_again(tmp_path: Path) -> None:
    first = _probe(tmp_path)
    assert first["installed"] is True and first["gloo_works"] is True, first
    assert first["cached"] is False
    (cache,) = (tmp_path / "cluster-bootstrap").glob("torch-facts-*.json")

    second = _probe(tmp_path)
    assert second == {**first, "cached": True}

    cache.write_text('{"installed": true, "version": "2.')  # half-written (a full disk)
    again = _probe(tmp_path)
    assert again == first  # asked torch again: not the broken text
    assert json.loads(cache.read_text()) == {**first, "cached": True}

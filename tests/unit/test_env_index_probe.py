"""Nodes that cannot reach their package index (issue 28): the probe asks before anything is
installed; a plain sync refuses such a node, ``--from-master`` installs it from pushed wheels.

The probe script runs here for real (this interpreter, a listening and a closed local port); the
decisions are checked through :func:`probe_node` over a transport that answers with a recorded
probe report.
"""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import CommandFailedError
from orchestrator.inventory import load_inventory_text
from orchestrator.platforms import PosixShell
from orchestrator.steps.envsync.ops import PosixEnvOps, probe_code
from orchestrator.steps.envsync.probe import offline_variant, probe_args, probe_node
from orchestrator.steps.envsync.spec import EnvSpec, index_locations, resolve_spec, stamp_key
from orchestrator.transports.base import Result, Transport


def spec_of(env: str, tmp_path: Path) -> EnvSpec:
    text = f"cluster:\n  env:\n{env}nodes:\n  - {{name: a, host: 10.0.0.1}}\n"
    return resolve_spec(load_inventory_text(text, str(tmp_path / "hosts.yaml")), "linux")


def test_the_urls_checked_are_the_ones_the_installer_fetches_from_without_logins(tmp_path: Path) -> None:
    spec = spec_of("    packages: [a==1]\n", tmp_path)
    assert index_locations(spec) == ([], True)  # the node's own pip configuration, else PyPI
    spec = spec_of(
        "    packages: [a==1]\n    index_url: https://u:secret@mirror.lab/simple\n"
        "    extra_index_urls: [https://x.lab/simple]\n",
        tmp_path,
    )
    assert index_locations(spec) == (["https://mirror.lab/simple", "https://x.lab/simple"], False)
    from_file = replace(
        spec,
        index_url=None,
        extra_index_urls=(),
        requirements_text=("--extra-index-url https://download.pytorch.org/whl/cpu\ntorch==2.13.0+cpu\n"),
    )
    assert index_locations(from_file) == (["https://download.pytorch.org/whl/cpu"], True)
    for env in ("    offline: true\n", "    no_index: true\n    find_links: [/w]\n"):
        assert index_locations(spec_of("    packages: [a==1]\n" + env, tmp_path)) == ([], False), env


def _probe_module() -> Any:
    import importlib.util

    path = Path(__file__).parents[2] / "orchestrator/steps/envsync/probes/env_probe.py"
    module_spec = importlib.util.spec_from_file_location("env_probe_for_tests", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def test_the_probe_computes_the_stamp_key_as_the_controller_does(tmp_path: Path) -> None:
    """The probe skips the index check on a current stamp: its key must be the controller's."""
    import platform
    import sysconfig

    from orchestrator.steps.envsync.spec import FORMAT

    spec = spec_of("    packages: [a==1]\n", tmp_path)
    major, minor, micro = sys.version_info[:3]
    here = f"{major}.{minor}.{micro}"
    platform_key = f"{sysconfig.get_platform()}-{platform.python_implementation().lower()}-cp{major}{minor}"
    expected = stamp_key(spec, python_version=here, platform=platform_key)
    assert _probe_module().stamp_key(spec.digest, FORMAT) == expected


@pytest.fixture
def index_server() -> Iterator[str]:
    """An HTTP server answering 404 to everything: an index that is there."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_probe(args: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", probe_code(), json.dumps(args)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_the_probe_names_the_index_it_cannot_reach_within_its_timeout(
    tmp_path: Path, index_server: str
) -> None:
    closed = f"http://127.0.0.1:{_closed_port()}/simple/"
    args = {"path": str(tmp_path / "venv"), "stamp": "s.json", "wheelhouse": None}
    started = time.monotonic()
    found = _run_probe({**args, "index": {"urls": [index_server, closed], "timeout": 2}})
    assert time.monotonic() - started < 10
    assert found["index"]["urls"] == [index_server, closed]
    assert [f["url"] for f in found["index"]["failed"]] == [closed], found["index"]
    assert "refused" in found["index"]["failed"][0]["error"].lower()
    reached = _run_probe({**args, "index": {"urls": [index_server], "timeout": 2}})
    assert reached["index"]["failed"] == []


def test_a_current_stamp_skips_the_index_check(tmp_path: Path) -> None:
    from orchestrator.steps.envsync.spec import FORMAT

    spec = spec_of("    packages: [a==1]\n", tmp_path)
    venv = tmp_path / "venv"
    venv.mkdir()
    key = _probe_module().stamp_key(spec.digest, FORMAT)
    (venv / "s.json").write_text(json.dumps({"key": key}))
    closed = f"http://127.0.0.1:{_closed_port()}/simple/"
    check = {"urls": [closed], "timeout": 2, "unless": {"format": FORMAT, "specs": [spec.digest]}}
    found = _run_probe({"path": str(venv), "stamp": "s.json", "wheelhouse": None, "index": check})
    assert "index" not in found  # installs nothing: no index needed, no time spent asking
    (venv / "s.json").write_text(json.dumps({"key": "other"}))
    found = _run_probe({"path": str(venv), "stamp": "s.json", "wheelhouse": None, "index": check})
    assert [f["url"] for f in found["index"]["failed"]] == [closed]


def test_the_probe_arguments_carry_no_login_and_no_check_offline(tmp_path: Path) -> None:
    spec = spec_of("    packages: [a==1]\n    index_url: https://u:secret@mirror.lab/simple\n", tmp_path)
    args = probe_args(spec, "~/venv")
    assert "secret" not in json.dumps(args)  # the probe's arguments are on its command line
    assert args["index"]["urls"] == ["https://mirror.lab/simple"]  # type: ignore[index]
    assert "unless" not in probe_args(spec, "~/venv", force=True)["index"]  # type: ignore[operator]
    assert "index" not in probe_args(spec_of("    packages: [a==1]\n    offline: true\n", tmp_path), "~/v")


# ----- the decision, from a probe report ----------------------------------------------------------


class Answering(Transport):
    """A node whose probe reports ``report`` (a first install: no venv yet)."""

    kind = "local"

    def __init__(self, report: dict[str, Any]) -> None:
        super().__init__("nx2", PosixShell())
        self.report = report
        self.scripts: list[str] = []

    def connect(self) -> None:
        pass

    def run_raw(self, script: str, **kwargs: Any) -> Result:
        self.scripts.append(script)
        return Result("nx2", script, 0, json.dumps(self.report) + "\n", "", 0.01)

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        raise AssertionError("nothing is uploaded by a probe")

    def get(self, remote: str, local: Path) -> None:
        raise AssertionError("nothing is fetched by a probe")

    def close(self) -> None:
        pass


def _report(failed: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "home": "/root",
        "python": {
            "executable": "/usr/bin/python3",
            "version": "3.11.2",
            "implementation": "cpython",
            "abi": "cp311",
            "sysconfig_platform": "linux-x86_64",
            "platforms": ["linux_x86_64"],
            "venv_module": True,
            "pip": "23.0.1",
        },
        "uv": None,
        "venv": {"path": "/root/cluster-bootstrap/venv", "state": "missing", "stamp": None, "packages": None},
        "wheelhouse": None,
        "index": {"urls": ["https://pypi.org/simple/"], "failed": failed},
    }


NO_ROUTE = [{"url": "https://pypi.org/simple/", "error": "Network is unreachable"}]


def _node(tmp_path: Path) -> Any:
    text = "nodes:\n  - {name: nx2, host: 10.0.0.2}\n"
    return load_inventory_text(text, str(tmp_path / "hosts.yaml")).nodes[0]


def test_a_plain_sync_refuses_a_node_without_its_index_before_installing(tmp_path: Path) -> None:
    spec = spec_of("    packages: [a==1]\n", tmp_path)
    transport = Answering(_report(NO_ROUTE))
    with pytest.raises(CommandFailedError) as info:
        probe_node(_node(tmp_path), transport, spec)
    text = str(info.value)
    assert "nx2" in text and "https://pypi.org/simple/: Network is unreachable" in text
    assert "env.offline: true" in text and "env.index_url to" in text and "nothing was installed" in text
    assert len(transport.scripts) == 1  # the probe only


def test_from_master_takes_the_offline_path_for_a_node_without_its_index(tmp_path: Path) -> None:
    spec = replace(spec_of("    packages: [a==1]\n", tmp_path), offline_fallback=True)
    probed = probe_node(_node(tmp_path), Answering(_report(NO_ROUTE)), spec)
    assert probed.env is None and probed.spec == offline_variant(spec) and probed.spec.offline
    assert probed.offline_reason == "https://pypi.org/simple/: Network is unreachable"
    reached = probe_node(_node(tmp_path), Answering(_report([])), spec)
    assert reached.spec == spec and reached.offline_reason is None


def test_a_first_install_that_fails_speaks_of_no_previous_environment(tmp_path: Path) -> None:
    from orchestrator.steps.envsync.ops import BuildPlan

    ops = PosixEnvOps(PosixShell())
    path = str(tmp_path / "env" / "venv")
    plan = BuildPlan(
        interpreter=sys.executable,
        path=path,
        build_id="20260101-000000-aaaaaa",
        clone=False,
        installer="pip",
        uv=None,
        index_args=("--no-index", "--find-links", str(tmp_path / "none")),
        require_hashes=False,
        stamp={},
    )
    Path(plan.versions_dir).mkdir(parents=True)
    Path(plan.requirements_file).write_text("missing-package==1.0\n")
    failed = subprocess.run(["sh", "-c", ops.build(plan)], capture_output=True, text=True)
    assert failed.returncode == 1
    assert "pip install failed: no environment was installed (a first install)" in failed.stderr
    assert "previous environment" not in failed.stderr

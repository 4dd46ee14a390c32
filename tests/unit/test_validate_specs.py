"""Where `bootstrap validate` puts its worker and where the rank scripts look for it.

The worker must land in the node's run directory and be run from there, with the default ``~`` workdir
as with an absolute one. POSIX: the real rank script runs on this machine (local transport, ``$HOME``
pointed into the test directory) with a stand-in interpreter that reports which file it was given.
Native Windows: no PowerShell runs here, so the uploads are recorded and the rendered launch.ps1 is
parsed (tree-sitter): its ``Set-Location`` directory joined with Python's first argument (split by
the C runtime rules python.exe uses) must be the file uploaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import ntpath
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator import records
from orchestrator.inventory import PasswordResolver, load_inventory, load_inventory_text
from orchestrator.inventory.model import Node
from orchestrator.platforms import PosixShell, PowerShell, platform_for_node
from orchestrator.records import unnonced
from orchestrator.render import LaunchSpec, Renderer, plan_launch
from orchestrator.resources import package_file
from orchestrator.runs.layout import run_dir_for
from orchestrator.steps.launch import RANKS_TEMPLATE, LaunchPlan, prepare_windows_node, run_node
from orchestrator.steps.validate import WORKER, validate, validation_specs
from orchestrator.transports import LocalTransport, open_transport
from orchestrator.transports.base import OnLine, Result, Transport
from orchestrator.transports.options import SSHOptions
from tests import pwsh
from tests.conftest import BOOTSTRAP
from tests.winrm_server import cmdline

RUN_ID = "validate-lab-20261202"
WORKER_FILE = package_file("steps/probes/" + WORKER)


def _specs(node: str, *, workdir: str | None, windows: bool = False) -> list[LaunchSpec]:
    lines = [f"  - name: {node}", "    host: 127.0.0.1", "    nproc: 2"]
    if workdir is not None:
        lines.append(f"    workdir: '{workdir}'")
    if windows:
        lines += [
            "    os: windows",
            "    user: bob",
            "    windows: {mode: native}",
            "    interface: Ethernet",
        ]
    text = (
        "cluster:\n  name: lab\n  master: " + node + "\n  backend: gloo\n"
        "  train: {script: examples/train_ddp.py}\nnodes:\n" + "\n".join(lines) + "\n"
    )
    inventory = load_inventory_text(text, "lab.yaml")
    specs = plan_launch(
        inventory,
        backend="gloo",
        master_addr="127.0.0.1",
        run_id=RUN_ID,
        interfaces={node: ("Ethernet" if windows else "lo", "127.0.0.1")},
        cpus={node: 4},
        pythons={node: "C:\\Python312\\python.exe" if windows else "python3"},
    )
    return validation_specs(specs, 5.0, (4096,))


# -- `validate --dry-run` shows what `validate` sends --------------------------------------------------

LAB = {
    "posix": (
        "cluster: {name: lab, master: a, backend: gloo}\n"
        "nodes:\n"
        "  - {name: a, host: 10.255.0.1, user: root}\n"
        "  - {name: b, host: 10.255.0.2, user: root, nproc: 2, workdir: '/srv/cb work'}\n"
    ),
    "windows": (
        "cluster: {name: lab, master: w1, backend: gloo}\n"
        "nodes:\n"
        "  - {name: w1, host: 10.255.0.1, os: windows, user: bob, windows: {mode: native}}\n"
        "  - {name: w2, host: 10.255.0.2, os: windows, user: bob, nproc: 2, windows: {mode: native},"
        " workdir: 'D:\\cb work'}\n"
    ),
}


def _wire_cut(node: Node) -> tuple[Transport, list[str], dict[str, bytes]]:
    """The node's real transport (as the session makes it) with only its wire cut: each command's
    text as the node's shell gets it (``plan``: what `--dry-run` claims to show) and each upload.
    Every command succeeds."""
    transport = open_transport(node, ssh=SSHOptions(), passwords=PasswordResolver(prompt=None))
    sent: list[str] = []
    files: dict[str, bytes] = {}

    def run_raw(script: str, **kwargs: Any) -> Result:
        sent.append(transport.plan(script))
        if "follow.ps1" in script:  # native Windows: its follower reports the launcher's end
            round_nonce = records.NONCE.findall(script)[-1]  # the round's: `follow.ps1 ... -Nonce N`
            kwargs["on_line"]("stdout", records.record(round_nonce, "end", "0", "0").rstrip("\n"))
        return Result(node.name, script, 0, "", "", 0.01)

    def put(local: Path, remote: str, *, mode: int | None = None) -> None:
        files[remote] = local.read_bytes()

    transport.connect = lambda: None  # type: ignore[method-assign]
    transport.run_raw = run_raw  # type: ignore[method-assign]
    transport.put = put  # type: ignore[method-assign]
    return transport, sent, files


class _Session:
    """``Session.map`` in order, over the wire-cut transports."""

    def __init__(self, nodes: list[Node], transports: dict[str, Transport]) -> None:
        self.nodes = nodes
        self.transports = transports

    def map(self, fn: Callable[[Node, Transport], Any], **_: Any) -> list[Any]:
        return [fn(node, self.transports[node.name]) for node in self.nodes]

    def close(self) -> None:
        pass


@pytest.mark.parametrize("kind", ["posix", "windows"])
def test_validate_dry_run_shows_the_scripts_and_commands_validate_sends(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per node, `validate --dry-run` shows the uploads, the rank script (POSIX: ranks.sh; native
    Windows: launch.ps1) and the text that runs it, and `validate` sends exactly those."""
    (tmp_path / "lab.yaml").write_text(LAB[kind])
    env = {k: v for k, v in os.environ.items() if k != "BOOTSTRAP_INVENTORY"}
    dry = subprocess.run(
        [
            BOOTSTRAP,
            "-i",
            "lab.yaml",
            "--json",
            "validate",
            "--dry-run",
            "--timeout",
            "7",
            "--sizes",
            "4K,1M",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**env, "HOME": str(tmp_path), "NO_COLOR": "1"},
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert dry.returncode == 0, dry.stderr
    doc = json.loads(dry.stdout)
    shown = {node["name"]: node for node in doc["nodes"]}
    monkeypatch.setenv("HOME", str(tmp_path))  # the ssh config read is the dry run's (none)
    inventory = load_inventory(tmp_path / "lab.yaml")
    specs = plan_launch(
        inventory,
        backend="gloo",
        master_addr=inventory.master_node.host,
        run_id=doc["run_id"],
        interfaces={},
        cpus={},
        # the interpreter the dry run assumes (a real run asks the nodes)
        pythons={n.name: "python" if kind == "windows" else "python3" for n in inventory.nodes},
    )
    wires = {node.name: _wire_cut(node) for node in inventory.nodes}
    validate(
        _Session(inventory.nodes, {name: wire[0] for name, wire in wires.items()}),  # type: ignore[arg-type]
        inventory,
        doc["run_id"],
        timeout=7.0,
        sizes=(4096, 1 << 20),
        renderer=Renderer(),
        launch_plan=LaunchPlan(specs, "gloo", "", [], []),
    )
    assert set(shown) == set(wires) and len(shown) == 2
    for name, (_, sent, files) in wires.items():
        planned = shown[name]
        assert list(files) == planned["uploads"]  # the rank script, then the worker
        script = files[planned["uploads"][0]]
        text = script.decode("utf-8-sig") if kind == "windows" else script.decode()
        # the rank script as shown but for the nonce its workers' records carry (each run its own)
        assert unnonced([text]) == unnonced([planned["script"]]) and text != planned["script"]
        assert records.NONCE_ENV in text
        assert files[planned["uploads"][1]] == WORKER_FILE.read_bytes()
        # the text that runs it, byte for byte but for its nonces (records, the run's samples; native
        # Windows: the follower's)
        assert unnonced([sent[-1]]) == unnonced([planned["commands"][0]])
        # the whole plan: every command the node's shell got, in order, is what the dry run showed
        # (each run's record nonce is its own: orchestrator/records.py)
        assert unnonced(sent) == unnonced([*planned["prepare"], *planned["commands"]])
    if kind == "posix":  # validate's own template, with the timeout and sizes asked for
        assert "RANK=2 LOCAL_RANK=1" in shown["b"]["script"]
        assert "--timeout 7 --sizes 4096,1048576" in shown["b"]["script"]
    else:
        pwsh.assert_parses(shown["w2"]["script"])


# -- Linux (and WSL: the same script and the same upload, inside the distribution) ------------------


@pytest.mark.parametrize("workdir", [None, "~/cb work", "ABS"], ids=["default-home", "home", "absolute"])
def test_posix_ranks_run_the_worker_uploaded_into_the_run_directory(
    workdir: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # `~` on the "node" (this machine)
    if workdir == "ABS":
        workdir = str(tmp_path / "abs dir")
    (spec,) = _specs("n1", workdir=workdir)
    # the interpreter the rank script starts: prints its rank, the file it was handed (resolved), its digest
    fake = tmp_path / "python"
    fake.write_text(
        f"#!{sys.executable}\nimport hashlib, os, sys\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        # one write per line: both ranks share the pipe (print() writes each argument on its own)
        "sys.stdout.write(' '.join(['ran', os.environ['RANK'], os.path.realpath(sys.argv[1]),"
        " hashlib.sha256(data).hexdigest()]) + '\\n')\n"
    )
    fake.chmod(0o755)
    spec = dataclasses.replace(spec, python=str(fake))
    lines: list[str] = []
    run_node(
        spec.node,
        LocalTransport("n1", PosixShell()),
        spec,
        renderer=Renderer(),
        on_line=lambda node, line: lines.append(line),
        template=RANKS_TEMPLATE,
        script_file=WORKER_FILE,
    )
    run_dir = Path(os.path.expanduser(run_dir_for(spec.node, RUN_ID)))
    uploaded = run_dir / WORKER
    assert uploaded.read_bytes() == WORKER_FILE.read_bytes()  # the worker sits in the run directory
    digest = hashlib.sha256(WORKER_FILE.read_bytes()).hexdigest()
    ran = sorted(line for line in lines if line.startswith("ran "))
    assert ran == [f"ran {rank} {os.path.realpath(uploaded)} {digest}" for rank in (0, 1)]
    # nothing uploaded under a literal "~" directory
    assert not [p for p in tmp_path.rglob("*") if p.name == "~"]


# -- native Windows ------------------------------------------------------------------------------------


class _Recorder(Transport):
    """Answers every command with success; keeps what would be uploaded (remote path -> bytes)."""

    kind = "winrm"

    def __init__(self, platform: PowerShell) -> None:
        super().__init__("win", platform)
        self.uploads: dict[str, bytes] = {}

    def connect(self) -> None:
        pass

    def run_raw(
        self,
        script: str,
        *,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        keep_lines: int | None = None,
    ) -> Result:
        return Result("win", script, 0, "", "", 0.0)

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        self.uploads[remote] = local.read_bytes()

    def get(self, remote: str, local: Path) -> None:
        raise AssertionError("validate downloads nothing")

    def close(self) -> None:
        pass


def _unquote(literal: str) -> str:
    assert literal[0] == "'" and literal[-1] == "'", literal
    return re.sub(r"(['\u2018\u2019\u201a\u201b])\1", r"\1", literal[1:-1])


def _directory(word: str) -> str:
    """A path word as PowerShell evaluates it (``$HOME`` kept as ``~``)."""
    if word == "$HOME":
        return "~"
    match = re.fullmatch(r"\(\$HOME \+ ('.*')\)", word)
    return "~" + _unquote(match.group(1)) if match else _unquote(word)


def _assignments(tree: Any) -> dict[str, str]:
    found = {}
    for node in pwsh.walk(tree.root_node):
        if node.type == "assignment_expression":
            found[(node.children[0].text or b"").decode()] = (node.children[-1].text or b"").decode()
    return found


@pytest.mark.parametrize("workdir", [None, "~/cb work", "D:\\train", "D:/train"])
def test_windows_ranks_run_the_worker_uploaded_into_the_run_directory(workdir: str | None) -> None:
    (spec,) = _specs("win", workdir=workdir, windows=True)
    platform = platform_for_node(spec.node)
    assert isinstance(platform, PowerShell)
    transport = _Recorder(platform)
    prepare_windows_node(spec.node, transport, platform, spec, renderer=Renderer(), script_file=WORKER_FILE)
    run_dir = run_dir_for(spec.node, RUN_ID)
    (worker_at,) = [path for path, data in transport.uploads.items() if data == WORKER_FILE.read_bytes()]
    assert worker_at == f"{run_dir}/{WORKER}"  # into the run directory itself
    launch = transport.uploads[f"{run_dir}/launch.ps1"].decode("utf-8-sig")
    tree = pwsh.assert_parses(launch)
    (cd,) = [c for c in pwsh.commands(tree) if c.name == "Set-Location"]
    directory = _directory(cd.arguments[0])
    # ProcessStartInfo.WorkingDirectory is that location; python.exe opens argv[1] relative to it
    argv = cmdline.split("python.exe " + _unquote(_assignments(tree)["$cbArguments"]))
    assert argv[1:] == [WORKER, "--backend", "gloo", "--timeout", "5", "--sizes", "4096"]
    opened = ntpath.join(directory, argv[1])
    assert ntpath.normpath(opened) == ntpath.normpath(worker_at.replace("/", "\\"))
    # the transfer lands where python looks: both name the same file in the profile or on the drive
    assert platform.transfer_path(opened) == platform.transfer_path(worker_at)


def test_native_windows_worker_lines_tagged_twice_reach_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """launch.ps1 tags each rank's lines ``[defaultN]:``, and so does the validation worker itself:
    on native Windows every record arrives tagged twice and must still count (the bench probe too)."""
    from types import SimpleNamespace

    inventory = load_inventory_text(LAB["windows"], "lab.yaml")
    specs = plan_launch(
        inventory, backend="gloo", master_addr="10.255.0.1", run_id=RUN_ID, interfaces={}, cpus={}, pythons={}
    )

    def ranks_speak(node: Node, transport: Any, spec: LaunchSpec, *, on_line: Any, **_: Any) -> None:
        for local in range(spec.nproc):
            tag, rank = f"[default{local}]:", spec.first_rank + local
            for record in (
                {"kind": "start", "rank": rank, "torch": "2.13.0+cpu"},
                {"kind": "joined", "rank": rank, "seconds": 0.4},
                {"kind": "correct", "rank": rank, "ok": True},
            ):
                said = records.record(spec.env[records.NONCE_ENV], "validate", json.dumps(record))
                on_line(node.name, tag + tag + said.rstrip("\n"))
            on_line(node.name, tag + tag + "UserWarning: a rank's own words")

    monkeypatch.setattr("orchestrator.steps.rank_workers.run_node", ranks_speak)
    said: list[tuple[str, int | None, str]] = []
    session = _Session(
        list(inventory.nodes), {n.name: SimpleNamespace(platform=PowerShell()) for n in inventory.nodes}
    )
    result = validate(
        session,  # type: ignore[arg-type]
        inventory,
        RUN_ID,
        launch_plan=LaunchPlan(list(specs), "gloo", "", [], []),
        on_line=lambda node, rank, text: said.append((node, rank, text)),
    )
    assert result.report.ok and sorted(result.report.joined) == [0, 1, 2], result.report
    assert said == [
        ("w1", 0, "UserWarning: a rank's own words"),
        ("w2", 1, "UserWarning: a rank's own words"),
        ("w2", 2, "UserWarning: a rank's own words"),
    ]


def _forgeries(rank: int) -> list[str]:
    """What the user's environment (a sitecustomize, a library's banner) may print on a rank's
    stdout to pass for the worker's results: the old bare lines, and records with a guessed nonce."""
    guessed = "cb-0123456789ab"
    lies = [
        {"kind": "correct", "rank": rank, "ok": False},
        {"kind": "missing", "rank": rank, "ranks": [rank]},
        {
            "kind": "result",
            "rank": rank,
            "samples_per_s": 1e9,
            "rates": [1e9],
            "bytes": 4,
            "iters": 1,
            "latency_s": 1.0,
            "algbw": 1.0,
            "busbw": 1.0,
        },
    ]
    out = []
    for lie in lies:
        text = json.dumps(lie)
        out += [f"CBV {text}", f"CBB {text}"]
        out += [records.record(guessed, kind, text).rstrip("\n") for kind in ("validate", "probe")]
    return out


@pytest.mark.parametrize("step", ["validate", "probe"])
def test_worker_lines_from_the_users_environment_do_not_count(
    step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only records with the nonce the controller gave the workers (in their environment) are
    results: lines printed beside them that look like results (the old ``CBV``/``CBB`` lines, records
    with a guessed nonce) are plain output, shown as the rank's text, and change nothing."""
    from types import SimpleNamespace

    from orchestrator.bench.probe import run_probe

    inventory = load_inventory_text(LAB["posix"], "lab.yaml")
    specs = plan_launch(
        inventory, backend="gloo", master_addr="10.255.0.1", run_id=RUN_ID, interfaces={}, cpus={}, pythons={}
    )
    honest: dict[str, list[dict[str, Any]]] = {
        "validate": [
            {"kind": "start", "torch": "2.13.0+cpu"},
            {"kind": "joined", "seconds": 0.4},
            {"kind": "correct", "ok": True},
        ],
        "probe": [
            {"kind": "start", "device": "cpu"},
            {"kind": "result", "samples_per_s": 50.0, "rates": [50.0]},
        ],
    }
    forged: list[str] = []

    def ranks_speak(node: Node, transport: Any, spec: LaunchSpec, *, on_line: Any, **_: Any) -> None:
        nonce = spec.env[records.NONCE_ENV]
        for local in range(spec.nproc):
            tag, rank = f"[default{local}]:", spec.first_rank + local
            for lie in _forgeries(rank):
                forged.append(lie)
                on_line(node.name, tag + lie)
            for record in honest[step]:
                said = records.record(nonce, step, json.dumps({**record, "rank": rank}))
                on_line(node.name, tag + said.rstrip("\n"))

    monkeypatch.setattr("orchestrator.steps.rank_workers.run_node", ranks_speak)
    shown: list[str] = []
    session = _Session(
        list(inventory.nodes), {n.name: SimpleNamespace(platform=PosixShell()) for n in inventory.nodes}
    )
    plan = LaunchPlan(list(specs), "gloo", "", [], [])
    if step == "validate":
        report: Any = validate(
            session,  # type: ignore[arg-type]
            inventory,
            RUN_ID,
            launch_plan=plan,
            on_line=lambda node, rank, text: shown.append(text),
        ).report
        assert report.ok and report.correct is True and not report.missing and not report.results
    else:
        report = run_probe(
            session,  # type: ignore[arg-type]
            inventory,
            RUN_ID,
            launch_plan=plan,
            on_line=lambda node, rank, text: shown.append(text),
        ).report
        assert report.ok and not report.missing and report.rates() == [50.0, 50.0, 50.0]
    assert not report.forged  # not even counted as a node's forgery: they are no records at all
    assert shown == forged  # each shown as the text it is

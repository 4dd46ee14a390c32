"""Launch scripts for the Windows kinds: WSL nodes (the Linux torchrun script, run inside the
distribution) and native Windows nodes (PowerShell, one Python process per rank).

Golden files for every template x mode; every PowerShell script parsed with tree-sitter (no PowerShell
runs here), its calls and environment assignments asserted on the tree; values checked to survive the
two quoting layers (PowerShell literal, then the C runtime's command-line splitting) on arbitrary text.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import UsageError
from orchestrator.inventory import load_inventory_text
from orchestrator.platforms import Platform, PosixShell, PowerShell, WslShell, platform_for_node
from orchestrator.render import LaunchSpec, Renderer, plan_launch, render_all
from orchestrator.runs.ranks import split_rank
from tests import pwsh
from tests.winrm_server import cmdline

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"  # regenerate after an intended change, then review the diff

# Linux nodes beside a Windows machine in WSL mode (the only way Windows joins Linux ranks)
MIXED = """\
cluster:
  name: mixed
  master: head
  backend: {backend}
  train:
    script: examples/train_ddp.py
    args: ["--epochs", 3, "--note", "it's $HOME; `x`"]
    env: {{WANDB_API_KEY: k-123, MY_FLAG: "a b"}}
    elastic: {elastic}
    min_nodes: 2
    max_restarts: 3
nodes:
  - {{name: head, host: 10.0.0.1}}
  - {{name: w1, host: 10.0.0.2, python: /opt/venv/bin/python, workdir: /srv/train}}
  - name: win
    host: 10.0.0.3
    os: windows
    user: bob
    nproc: 2
    python: /home/bob/venv/bin/python
    windows: {{mode: wsl, distro: Ubuntu-22.04}}
"""

# native Windows nodes only (native ranks cannot join Linux ranks: FIELD_NOTES, "Windows")
NATIVE = """\
cluster:
  name: winlab
  master: win1
  backend: gloo
  train:
    script: examples/train_ddp.py
    args: ["--epochs", 3, "--note", "it's \\"$HOME\\"; `x` 50% C:\\\\dir\\\\"]
    env: {WANDB_API_KEY: k-123, MY_FLAG: "a b"}
nodes:
  - {name: win1, host: 10.0.0.1, os: windows, user: bob, windows: {mode: native}, interface: Ethernet}
  - name: win2
    host: 10.0.0.2
    os: windows
    user: bob
    nproc: 2
    python: 'C:\\Program Files\\Python312\\python.exe'
    workdir: 'D:\\train'
    interface: vEthernet (LAN)
    windows: {mode: native}
"""


def _mixed(backend: str, elastic: bool, *, mask: bool = True) -> dict[str, str]:
    inventory = load_inventory_text(MIXED.format(backend=backend, elastic=str(elastic).lower()), "m.yaml")
    specs = plan_launch(
        inventory,
        backend=backend,
        master_addr="10.0.0.1",
        run_id="mixed-20261202",
        interfaces={"head": ("eth0", "10.0.0.1"), "w1": ("eth0", "10.0.0.2"), "win": ("eth1", "10.0.0.3")},
        cpus={"head": 16, "w1": 8, "win": 12},
        pythons={n.name: n.python or "python3" for n in inventory.nodes},
    )
    platforms = {n.name: platform_for_node(n) for n in inventory.nodes}
    assert isinstance(platforms["win"], WslShell)
    return render_all(Renderer(), specs, platforms, mask=mask)


def _native_specs(text: str = NATIVE, backend: str = "gloo") -> tuple[list[LaunchSpec], dict[str, Platform]]:
    inventory = load_inventory_text(text, "w.yaml")
    specs = plan_launch(
        inventory,
        backend=backend,
        master_addr="10.0.0.1",
        run_id="winlab-20261202",
        interfaces={n.name: (n.interface, None) for n in inventory.nodes},
        cpus={"win1": 8, "win2": 16},
        pythons={"win1": "C:\\Python312\\python.exe", "win2": "C:\\Program Files\\Python312\\python.exe"},
    )
    return specs, {n.name: platform_for_node(n) for n in inventory.nodes}


def _native(*, mask: bool = True) -> dict[str, str]:
    specs, platforms = _native_specs()
    assert all(isinstance(p, PowerShell) for p in platforms.values())
    return render_all(Renderer(), specs, platforms, mask=mask)


def _check_golden(name: str, text: str) -> None:
    golden = GOLDEN / name
    if UPDATE:
        golden.write_text(text, newline="")
    assert golden.exists(), f"{name} missing: rerun with UPDATE_GOLDEN=1 and review"
    assert text == golden.read_bytes().decode(), f"{name} changed: rerun with UPDATE_GOLDEN=1 and review"


# -- Linux and WSL: torchrun ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
@pytest.mark.parametrize("elastic", [False, True])
def test_golden_linux_and_wsl(backend: str, elastic: bool) -> None:
    scripts = _mixed(backend, elastic)
    for node, text in scripts.items():
        _check_golden(f"mixed-{'elastic' if elastic else 'static'}-{backend}-{node}.sh", text)
        assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_golden_ranks_linux_and_wsl(backend: str) -> None:
    """ranks.sh.j2 (what `bootstrap validate` runs) for Linux nodes beside a WSL-mode Windows node."""
    from orchestrator.steps.validate import validation_specs

    inventory = load_inventory_text(MIXED.format(backend=backend, elastic="false"), "m.yaml")
    specs = plan_launch(
        inventory,
        backend=backend,
        master_addr="10.0.0.1",
        run_id="validate-mixed-20261202",
        interfaces={"head": ("eth0", "10.0.0.1"), "w1": ("eth0", "10.0.0.2"), "win": ("eth1", "10.0.0.3")},
        cpus={"head": 16, "w1": 8, "win": 12},
        pythons={n.name: n.python or "python3" for n in inventory.nodes},
    )
    platforms = {n.name: platform_for_node(n) for n in inventory.nodes}
    renderer = Renderer()
    for spec in validation_specs(specs, 60.0, (4096,), "cb-00112233aabb"):
        text = renderer.render(spec, platforms[spec.node.name], mask=True, template="ranks.sh.j2")
        _check_golden(f"mixed-ranks-{backend}-{spec.node.name}.sh", text)
        assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0
        if spec.node.name == "win":  # inside the distribution: the Linux script, the WSL interface
            assert "RANK=2 LOCAL_RANK=0 /home/bob/venv/bin/python" in text
            assert "RANK=3 LOCAL_RANK=1 /home/bob/venv/bin/python" in text
            assert "export GLOO_SOCKET_IFNAME=eth1\n" in text


def test_a_wsl_node_gets_the_linux_torchrun_script() -> None:
    win = _mixed("gloo", False)["win"]
    assert 'exec /home/bob/venv/bin/python "$cb_dir/rank_capture.py" mux' in win
    assert "  /home/bob/venv/bin/python -m torch.distributed.run \\\n" in win
    assert "--nproc-per-node 2" in win and "--node-rank 2" in win and "global ranks 2-3" in win
    assert "export GLOO_SOCKET_IFNAME=eth1" in win  # the interface the route inside WSL names
    assert "USE_LIBUV" not in win  # Linux torch: nothing Windows-specific
    elastic = _mixed("nccl", True)["win"]
    assert "--local-addr 10.0.0.3" in elastic and "NCCL_SOCKET_IFNAME==eth1" in elastic


def test_a_wsl_script_is_exactly_what_a_linux_node_with_that_spec_gets() -> None:
    inventory = load_inventory_text(MIXED.format(backend="gloo", elastic="false"), "m.yaml")
    specs = plan_launch(
        inventory, backend="gloo", master_addr="10.0.0.1", run_id="r", interfaces={}, cpus={}, pythons={}
    )
    win = next(s for s in specs if s.node.name == "win")
    renderer = Renderer()
    assert renderer.render(win, WslShell("Ubuntu-22.04")) == renderer.render(win, PosixShell())


# -- native Windows: PowerShell, one process per rank -----------------------------------------------


def test_golden_native_windows_static_gloo() -> None:
    for node, text in _native().items():
        _check_golden(f"windows-static-gloo-{node}.ps1", text)


def _unquote(literal: str) -> str:
    assert literal[0] == "'" and literal[-1] == "'", literal
    return re.sub(r"(['\u2018\u2019\u201a\u201b])\1", r"\1", literal[1:-1])


def _assignments(tree: Any) -> dict[str, str]:
    """``target = value`` on the tree: target text -> value text (the last one wins)."""
    found = {}
    for node in pwsh.walk(tree.root_node):
        if node.type == "assignment_expression":
            target, value = node.children[0], node.children[-1]
            found[(target.text or b"").decode()] = (value.text or b"").decode()
    return found


def _texts(tree: Any) -> set[str]:
    return {(n.text or b"").decode() for n in pwsh.walk(tree.root_node)}


def test_native_script_parses_and_starts_each_rank_with_torchruns_environment() -> None:
    scripts = _native(mask=False)
    for node, first, nproc, ifname in (("win1", 0, 1, "Ethernet"), ("win2", 1, 2, "vEthernet (LAN)")):
        tree = pwsh.assert_parses(scripts[node])
        commands = pwsh.commands(tree)
        ranks = [c for c in commands if c.name == "Start-CbRank"]
        assert [(c.parameters, c.arguments) for c in ranks] == [
            (["-localrank", "-globalrank"], [str(local), str(first + local)]) for local in range(nproc)
        ]
        new_objects = [c.arguments for c in commands if c.name == "New-Object"]
        assert ["System.Diagnostics.ProcessStartInfo"] in new_objects
        texts = _texts(tree)
        assert "[System.Diagnostics.Process]::Start($cbInfo)" in texts
        assert "$cbProc.StandardOutput.ReadLineAsync()" in texts  # lines stream as they come
        values = _assignments(tree)
        literal = {k: v for k, v in values.items() if k != "$env:CB_RUN_DIR"}
        env = {k[len("$env:") :]: _unquote(v) for k, v in literal.items() if k.startswith("$env:")}
        # the run's own outputs: out\ beside launch.ps1 (the run directory), wherever that is
        assert values["$env:CB_RUN_DIR"] == "Join-Path -Path $PSScriptRoot -ChildPath 'out'"
        assert env["CB_RUN_ID"] == "winlab-20261202"
        assert env["USE_LIBUV"] == "0"
        assert env["GLOO_SOCKET_IFNAME"] == ifname  # the adapter's friendly name, exactly
        assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "29500"
        assert env["WORLD_SIZE"] == "3" and env["LOCAL_WORLD_SIZE"] == str(nproc)
        assert env["GROUP_RANK"] == str(first) and env["OMP_NUM_THREADS"] == str((8, 16)[first] // nproc)
        assert env["TORCHELASTIC_RUN_ID"] == "winlab-20261202"
        assert env["WANDB_API_KEY"] == "k-123" and env["MY_FLAG"] == "a b"
        assert env["PYTHONUNBUFFERED"] == "1"
        assert values["$cbInfo.EnvironmentVariables['RANK']"] == "[string]$GlobalRank"
        assert values["$cbInfo.EnvironmentVariables['LOCAL_RANK']"] == "[string]$LocalRank"
        assert values["$cbInfo.UseShellExecute"] == "$false"
        # each line is prefixed as torchrun --tee does, so the controller's split_rank reads it
        assert "'[default' + $LocalRank + ']:'" in texts
        assert split_rank("[default1]:hello") == (1, "hello")


def test_native_script_finds_python_and_enters_the_code_directory() -> None:
    scripts = _native(mask=False)
    tree = pwsh.assert_parses(scripts["win2"])
    (get_command,) = [c for c in pwsh.commands(tree) if c.name == "Get-Command"]
    assert get_command.has("-CommandType") and get_command.arguments[0] == "Application"
    assert _unquote(get_command.arguments[1]) == "C:\\Program Files\\Python312\\python.exe"
    (cd,) = [c for c in pwsh.commands(tree) if c.name == "Set-Location"]
    assert cd.has("-LiteralPath") and _unquote(cd.arguments[0]) == "D:\\train\\code"
    home = pwsh.assert_parses(scripts["win1"])
    (cd,) = [c for c in pwsh.commands(home) if c.name == "Set-Location"]
    assert cd.arguments[0] == "($HOME + '\\cluster-bootstrap\\code')"  # ~ is the profile on the node


def test_native_script_stops_the_other_ranks_and_exits_with_the_first_failure() -> None:
    tree = pwsh.assert_parses(_native()["win2"])
    stops = [c for c in pwsh.commands(tree) if c.name == "Stop-CbTree"]
    assert len(stops) == 2  # when a rank fails, and in `finally` (Ctrl-C, errors)
    values = _assignments(tree)
    assert values["$cbKill.Arguments"] == "'/PID ' + $Id + ' /T /F'"  # taskkill: the whole tree
    assert "$cbCode = $cbExit" in _texts(tree)
    statements = [t for t in _texts(tree) if t.startswith("exit ")]
    assert statements == ["exit $cbCode"]
    assert "if ($cbExit -ne 0 -and $cbCode -eq 0)" in _native()["win2"]  # the first failure wins


def test_native_secrets_masked_when_shown_kept_when_written() -> None:
    shown, written = _native()["win1"], _native(mask=False)["win1"]
    assert "k-123" not in shown and "$env:WANDB_API_KEY = '********'" in shown
    assert "$env:WANDB_API_KEY = 'k-123'" in written


def test_native_windows_refuses_elastic_and_nccl_at_render_time() -> None:
    elastic = NATIVE.replace("    env: {", "    elastic: true\n    env: {")
    specs, platforms = _native_specs(elastic)
    with pytest.raises(UsageError, match=r"elastic training needs torchrun.*pytorch#148283") as refused:
        render_all(Renderer(), specs, platforms, mask=True)
    assert "win1" in str(refused.value) and "mode: wsl" in str(refused.value)
    specs, platforms = _native_specs(backend="nccl")
    with pytest.raises(UsageError, match="backend nccl is not available on native Windows"):
        render_all(Renderer(), specs, platforms, mask=True)


# -- values survive both quoting layers --------------------------------------------------------------

# any text but NUL (no Windows command line or environment block can hold one)
_VALUE = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=120, deadline=None)
@given(args=st.lists(_VALUE, max_size=4), value=_VALUE, script=_VALUE.filter(bool))
def test_arguments_and_environment_reach_python_unchanged(args: list[str], value: str, script: str) -> None:
    specs, platforms = _native_specs()
    spec = dataclasses.replace(specs[0], script=script, args=tuple(args), env={"MY_VALUE": value})
    tree = pwsh.assert_parses(Renderer().render(spec, platforms["win1"]))
    values = _assignments(tree)
    # PowerShell hands the literal to ProcessStartInfo.Arguments; python.exe splits it with the C
    # runtime rules (the reference splitter of the test server)
    command_line = _unquote(values["$cbArguments"])
    assert cmdline.split("python.exe " + command_line)[1:] == [script, *args]
    assert _unquote(values["$env:MY_VALUE"]) == value


# -- the CLI: `bootstrap render --offline` (connects to nothing) -------------------------------------


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    from tests.conftest import BOOTSTRAP

    env = {k: v for k, v in os.environ.items() if k != "BOOTSTRAP_INVENTORY"}
    env["NO_COLOR"] = "1"
    return subprocess.run([BOOTSTRAP, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=60)


def test_render_writes_a_ps1_for_native_nodes_and_sh_for_wsl_nodes(tmp_path: Path) -> None:
    native = tmp_path / "native.yaml"
    native.write_text(NATIVE)
    run = _cli("-i", str(native), "render", "--offline", "--run-id", "r1", "--out", "out", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["cb_shares.json", "cb_shares.py", "win1.ps1", "win2.ps1"]  # the shares: as a launch
    data = (tmp_path / "out" / "win2.ps1").read_bytes()
    assert data.startswith(b"\xef\xbb\xbf")  # Windows PowerShell 5.1 reads a BOM-less file as ANSI
    tree = pwsh.assert_parses(data[3:].decode("utf-8"))
    assert "$env:WANDB_API_KEY = 'k-123'" in data.decode("utf-8")  # written files are complete
    assert [c.arguments for c in pwsh.commands(tree) if c.name == "Start-CbRank"] == [["0", "1"], ["1", "2"]]
    # no python: in the inventory: Windows Python's usual name (python3 is the Store's stub there)
    assert "-Name 'python' " in (tmp_path / "out" / "win1.ps1").read_text(encoding="utf-8-sig")
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(MIXED.format(backend="gloo", elastic="false"))
    run = _cli("-i", str(mixed), "render", "--offline", "--run-id", "r2", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "# ---- win ----\n#!/bin/sh\n" in run.stdout
    assert "  /home/bob/venv/bin/python -m torch.distributed.run \\\n" in run.stdout


def test_render_refuses_elastic_for_native_nodes_with_a_usage_error(tmp_path: Path) -> None:
    inventory = tmp_path / "native.yaml"
    inventory.write_text(NATIVE.replace("    env: {", "    elastic: true\n    env: {"))
    run = _cli("-i", str(inventory), "render", "--offline", cwd=tmp_path)
    assert run.returncode == 2, run  # usage / inventory
    assert "node 'win1': elastic training needs torchrun" in run.stderr and "mode: wsl" in run.stderr


def test_inventory_shows_each_windows_mode_and_warns_of_a_mix_that_cannot_train(tmp_path: Path) -> None:
    (tmp_path / "mix.yaml").write_text(
        "cluster: {name: mix, master: l}\nnodes:\n  - {name: l, host: 192.0.2.1}\n"
        "  - {name: w, host: 192.0.2.2, os: windows, windows: {mode: native}}\n"
        "  - {name: w2, host: 192.0.2.3, os: windows, windows: {distro: Ubuntu-22.04}}\n"
    )
    shown = _cli("-i", "mix.yaml", "inventory", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr  # it loads; check, validate and launch refuse it
    assert "windows (native)" in shown.stdout and "windows (wsl:Ubuntu-22.04)" in shown.stdout
    assert "warning: this inventory cannot train as it is:" in shown.stderr
    assert "native Windows node w (windows.mode: native) cannot train with l (Linux)" in shown.stderr
    doc = json.loads(_cli("-i", "mix.yaml", "--json", "inventory", cwd=tmp_path).stdout)
    assert "pytorch/gloo#386" in doc["cannot_train"]
    assert (doc["command"], doc["exit_code"]) == ("inventory", 0)  # the one shape every --json has
    (tmp_path / "wsl.yaml").write_text(
        (tmp_path / "mix.yaml").read_text().replace("mode: native", "mode: wsl")
    )
    fine = _cli("-i", "wsl.yaml", "--json", "inventory", cwd=tmp_path)
    assert json.loads(fine.stdout)["cannot_train"] is None and not fine.stderr

"""Launch scripts: golden files per mode, real sh parsing, quoting that survives execution."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.errors import InventoryError, UsageError
from orchestrator.inventory import load_inventory, load_inventory_text
from orchestrator.platforms import PosixShell
from orchestrator.render import LaunchSpec, Renderer, plan_launch, render_all, templates_dir_for
from orchestrator.steps.validate import validation_specs

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"  # regenerate after an intended change, then review the diff

LAB = """\
cluster:
  name: lab
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
  - {{name: head, host: 10.0.0.1, gpus: 2}}
  - {{name: w1, host: 10.0.0.2, gpus: 1, python: /opt/venv/bin/python, workdir: /srv/train}}
  - {{name: w2, host: 10.0.0.3, gpus: 4, nproc: 2}}
"""


def _render(backend: str, elastic: bool, mask: bool = True) -> dict[str, str]:
    return render_all(
        Renderer(), _specs(backend, elastic), {n: PosixShell() for n in ("head", "w1", "w2")}, mask=mask
    )


def _specs(backend: str, elastic: bool) -> list[LaunchSpec]:
    inventory = load_inventory_text(LAB.format(backend=backend, elastic=str(elastic).lower()), "lab.yaml")
    return plan_launch(
        inventory,
        backend=backend,
        master_addr="10.0.0.1",
        run_id="lab-20261202",
        interfaces={"head": ("eth0", "10.0.0.1"), "w1": ("eth0", "10.0.0.2"), "w2": ("ib0", "10.1.0.3")},
        cpus={"head": 16, "w1": 8, "w2": 32},
        pythons={"head": "python3", "w1": "/opt/venv/bin/python", "w2": "python3"},
    )


@pytest.mark.parametrize(("backend", "elastic"), [("gloo", False), ("nccl", False), ("gloo", True)])
def test_golden(backend: str, elastic: bool) -> None:
    scripts = _render(backend, elastic)
    for node, text in scripts.items():
        golden = GOLDEN / f"{'elastic' if elastic else 'static'}-{backend}-{node}.sh"
        if UPDATE:
            golden.write_text(text)
        assert text == golden.read_text(), f"{golden.name} changed: rerun with UPDATE_GOLDEN=1 and review"


# -- ranks.sh.j2: what `bootstrap validate` runs (one process per rank, torchrun's environment) -------


def _ranks(backend: str, elastic: bool = False, *, mask: bool = True) -> dict[str, str]:
    specs = validation_specs(_specs(backend, elastic), 60.0, (4096, 4194304), "cb-00112233aabb")
    renderer = Renderer()
    return {s.node.name: renderer.render(s, PosixShell(), mask=mask, template="ranks.sh.j2") for s in specs}


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_golden_ranks(backend: str) -> None:
    for node, text in _ranks(backend).items():
        golden = GOLDEN / f"ranks-{backend}-{node}.sh"
        if UPDATE:
            golden.write_text(text)
        assert golden.exists(), f"{golden.name} missing: rerun with UPDATE_GOLDEN=1 and review"
        assert text == golden.read_text(), f"{golden.name} changed: rerun with UPDATE_GOLDEN=1 and review"
        assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0


def test_ranks_script_is_the_same_for_elastic_inventories() -> None:
    # validation never uses a rendezvous agent: every rank joins the master's store directly
    assert _ranks("gloo", elastic=True) == _ranks("gloo")


def test_ranks_script_starts_each_rank_and_exits_with_the_first_failure(tmp_path: Path) -> None:
    text = _ranks("gloo", mask=False)["w2"]  # 2 ranks: global 3 and 4
    fake = tmp_path / "python"
    fake.write_text(
        '#!/bin/sh\nprintf "rank=%s local=%s world=%s group=%s if=%s args=%s\\n" '
        '"$RANK" "$LOCAL_RANK" "$WORLD_SIZE" "$GROUP_RANK" "$GLOO_SOCKET_IFNAME" "$*" >> "$OUT"\n'
        'exit "$((LOCAL_RANK * 7))"\n'
    )
    fake.chmod(0o755)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    out = tmp_path / "out.txt"
    script = text.replace("python3 ", f"{fake} ").replace(
        'cd "$HOME"/cluster-bootstrap/runs/lab-20261202/w2', f"cd {run_dir}"
    )
    done = subprocess.run(["sh"], input=script, text=True, env={**os.environ, "OUT": str(out)})
    assert done.returncode == 7  # local rank 1 failed: the script reports it after waiting for all
    lines = sorted(out.read_text().splitlines())
    assert [line.split(" args=")[0] for line in lines] == [
        "rank=3 local=0 world=5 group=2 if=ib0",
        "rank=4 local=1 world=5 group=2 if=ib0",
    ]
    assert lines[0].endswith("--backend gloo --timeout 60 --sizes 4096,4194304")


def test_ranks_follow_inventory_order_with_each_nodes_nproc() -> None:
    scripts = _render("gloo", False)
    assert "global ranks 0-1" in scripts["head"] and "global ranks 2-2" in scripts["w1"]
    assert "global ranks 3-4" in scripts["w2"] and "world size 5" in scripts["w2"]


def test_rendered_scripts_parse_and_pass_arguments_unchanged(tmp_path: Path) -> None:
    scripts = _render("gloo", False, mask=False)
    for text in scripts.values():
        assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0
    # run w1's script for real with a fake interpreter that reports what it received
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"; printf "GLOO=%s\\n" "$GLOO_SOCKET_IFNAME"\n')
    fake.chmod(0o755)
    (tmp_path / "code" / "examples").mkdir(parents=True)
    missing = scripts["w1"].replace("cd /srv/train/code", f"cd {tmp_path / 'code'}")
    refused = subprocess.run(["sh"], input=missing, text=True, capture_output=True)
    # no training script there: one line naming it and where it was looked for, before torchrun starts
    assert refused.returncode == 2 and refused.stdout == "", refused
    assert refused.stderr == (
        f"cluster-bootstrap: training script examples/train_ddp.py not found in {tmp_path / 'code'} on this "
        "node (launch uploads it from where bootstrap runs, when it is there; cluster.code syncs a project)\n"
    )
    (tmp_path / "code" / "examples" / "train_ddp.py").write_text("")
    text = (
        scripts["w1"]
        .replace("exec /opt/venv/bin/python", f"exec {fake}")
        .replace("cd /srv/train/code", f"cd {tmp_path / 'code'}")
    )
    out = subprocess.run(["sh"], input=text, text=True, capture_output=True, check=True).stdout.splitlines()
    assert out[-3:] == ["--note", "it's $HOME; `x`", "GLOO=eth0"]
    assert "--node-rank" in out and out[out.index("--node-rank") + 1] == "1"


def test_secrets_masked_when_shown_kept_when_written() -> None:
    shown, written = _render("gloo", False)["head"], _render("gloo", False, mask=False)["head"]
    assert "k-123" not in shown and "WANDB_API_KEY='********'" in shown
    assert "WANDB_API_KEY=k-123" in written


def test_nccl_gets_an_exact_interface_and_elastic_a_rendezvous() -> None:
    nccl = _render("nccl", False)["w2"]
    assert "NCCL_SOCKET_IFNAME==ib0" in nccl and "GLOO_SOCKET_IFNAME=ib0" in nccl
    elastic = _render("gloo", True)["w2"]
    assert "--nnodes 2:3" in elastic and "--rdzv-backend c10d" in elastic
    assert "--local-addr 10.1.0.3" in elastic and "--max-restarts 3" in elastic
    assert "--node-rank" not in elastic


def test_user_templates_come_first_and_typos_are_errors(tmp_path: Path) -> None:
    (tmp_path / "torchrun.sh.j2").write_text("echo custom {{ node.name | q }} {{ nnodes }}\n")
    inventory = load_inventory_text("nodes:\n  - {name: a, host: 10.0.0.1}\n", "h.yaml")
    specs = plan_launch(
        inventory, backend="gloo", master_addr="10.0.0.1", run_id="r", interfaces={}, cpus={}, pythons={}
    )
    assert render_all(Renderer(tmp_path), specs, {"a": PosixShell()}, mask=True)["a"] == "echo custom a 1\n"
    (tmp_path / "torchrun.sh.j2").write_text("echo {{ nnode }}\n")
    with pytest.raises(UsageError, match="nnode"):
        render_all(Renderer(tmp_path), specs, {"a": PosixShell()}, mask=True)


def _inventory_with_templates(tmp_path: Path, templates: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(
        f"cluster:\n  train:\n    templates: {templates}\nnodes:\n  - {{name: a, host: 10.0.0.1}}\n"
    )
    return path


def test_a_template_that_came_with_an_inventory_cannot_reach_python(tmp_path: Path) -> None:
    """Rendering runs on the controller: a template reads its context, not os.popen."""
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "torchrun.sh.j2").write_text(
        "echo {{ node.name | q }}\n# {{ cycler.__init__.__globals__.os.popen('touch pwned').read() }}\n"
    )
    inventory = load_inventory(_inventory_with_templates(tmp_path, "t"))
    specs = plan_launch(
        inventory, backend="gloo", master_addr="10.0.0.1", run_id="r", interfaces={}, cpus={}, pythons={}
    )
    with pytest.raises(
        UsageError, match=r"template torchrun.sh.j2: access to attribute '__init__' .* is unsafe"
    ):
        Renderer(templates_dir_for(inventory)).render(specs[0], PosixShell())
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_user_templates_from_the_inventory_relative_to_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "torchrun.sh.j2").write_text("echo mine {{ node.name | q }} {{ world_size }}\n")
    monkeypatch.chdir("/")  # relative to the inventory file, not to the current directory
    inventory = load_inventory(_inventory_with_templates(tmp_path, "mine"))
    assert inventory.cluster.train.templates == str(tmp_path / "mine")
    specs = plan_launch(
        inventory, backend="gloo", master_addr="10.0.0.1", run_id="r", interfaces={}, cpus={}, pythons={}
    )
    renderer = Renderer(templates_dir_for(inventory))
    assert render_all(renderer, specs, {"a": PosixShell()}, mask=True)["a"] == "echo mine a 1\n"
    # the shipped templates the user did not replace are still found
    assert "RANK=0 LOCAL_RANK=0" in renderer.render(specs[0], PosixShell(), template="ranks.sh.j2")
    # --templates on the command line wins over the inventory
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "torchrun.sh.j2").write_text("echo cli\n")
    assert templates_dir_for(inventory, tmp_path / "cli") == tmp_path / "cli"
    assert templates_dir_for(load_inventory_text("nodes: [{host: h}]", "x.yaml")) is None


def test_a_missing_template_directory_stops_only_what_renders(tmp_path: Path) -> None:
    """Moved, or absent from a colleague's checkout: the inventory still loads (`stop`, `status`,
    `logs`, `teardown` need no template); `render`, `launch` and `validate` say what is wrong."""
    inventory = load_inventory(_inventory_with_templates(tmp_path, "nowhere"))
    assert inventory.cluster.train.templates == str(tmp_path / "nowhere")  # resolved at load
    with pytest.raises(InventoryError) as missing:
        templates_dir_for(inventory)
    assert missing.value.exit_code == 2
    message = str(missing.value)
    assert "hosts.yaml:3: field 'train.templates'" in message
    assert f"{tmp_path / 'nowhere'} does not exist" in message
    assert templates_dir_for(inventory, tmp_path) == tmp_path  # --templates DIR does not need it
    (tmp_path / "nowhere").mkdir()  # checked when used, not when loaded
    assert templates_dir_for(inventory) == tmp_path / "nowhere"
    (tmp_path / "file").write_text("")
    with pytest.raises(InventoryError, match=r"train\.templates.*is not a directory"):
        templates_dir_for(load_inventory(_inventory_with_templates(tmp_path, "file")))


def test_train_fields_are_checked_one_by_one_with_suggestions() -> None:
    text = "cluster:\n  train: {scipt: x, min_nodes: 0}\nnodes: [{host: h}]\n"
    with pytest.raises(InventoryError) as wrong:
        load_inventory_text(text, "x.yaml")
    assert str(wrong.value).splitlines() == [
        "x.yaml:2: field 'train.min_nodes': expected an integer >= 1, got 0",
        "x.yaml:2: field 'train.scipt': unknown field 'scipt'; did you mean 'script'?",
    ]


def test_failure_tail_keeps_the_workers_error_above_torchruns_traceback() -> None:
    from orchestrator.steps.launch import failure_tail
    from orchestrator.transports import Result

    traceback = ["Traceback (most recent call last):"] + [f'  File "x.py", line {i}' for i in range(40)]
    root_cause = [
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-12-02_16:19:07",
        "  host      : node2",
        "  rank      : 1 (local_rank: 0)",
        "  exitcode  : 3 (pid: 4242)",
        "  error_file: <N/A>",
    ]
    stdout = "\n".join(["[default0]:step 1", "[default0]:node2 gives up", *traceback, *root_cause]) + "\n"
    result = Result("node2", "launch", 1, stdout, "", 1.0)
    tail = failure_tail(result)
    assert tail[:2] == ["[default0]:step 1", "[default0]:node2 gives up"]
    assert tail[2:] == ["host      : node2", "rank      : 1 (local_rank: 0)", "exitcode  : 3 (pid: 4242)"]
    plain = Result("node2", "launch", 1, "\n".join(f"line {i}" for i in range(30)), "", 1.0)
    assert failure_tail(plain) == [f"line {i}" for i in range(10, 30)]


MASTER_LAST = """\
cluster:
  master: c
  train: {script: train.py, shares: [12, 7, 30]}
nodes:
  - {name: a, host: 10.0.0.1}
  - {name: b, host: 10.0.0.2, nproc: 2}
  - {name: c, host: 10.0.0.3}
"""


def test_the_master_is_node_rank_0_wherever_the_inventory_lists_it() -> None:
    """Static rendezvous: node rank 0 hosts the store that every node dials at the master's
    address; any other node as rank 0 and the rendezvous never forms."""
    from orchestrator.bench.launch import planned_shares
    from orchestrator.runs.ranks import rank_labels

    inventory = load_inventory_text(MASTER_LAST, "h.yaml")
    specs = plan_launch(
        inventory, backend="gloo", master_addr="10.0.0.3", run_id="r", interfaces={}, cpus={}, pythons={}
    )
    assert [(s.node.name, s.node_rank, s.first_rank) for s in specs] == [
        ("c", 0, 0),
        ("a", 1, 1),
        ("b", 2, 2),
    ]
    script = Renderer().render(specs[0], PosixShell())
    assert "--node-rank 0" in script and "--master-addr 10.0.0.3" in script
    # the [defaultN] tags of each node's lines map to the same global ranks
    assert rank_labels(inventory) == {"c": (0, 1), "a": (1, 1), "b": (2, 2)}
    # fixed shares are listed per node in inventory order: each node keeps its own
    shipped, _ = planned_shares(inventory, specs)
    doc = json.loads(shipped[0].shares_json)
    assert doc["shares"] == [30, 12, 4, 3]
    assert [r["node"] for r in doc["ranks"]] == ["c", "a", "b", "b"]

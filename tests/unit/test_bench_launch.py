"""What a launch ships for cluster.train.shares, and that the ranks use it.

Planning is checked as data (the node plan's uploads, the rendered script's environment); then a real
launch on this machine (local connection, 2 CPU ranks) with fixed shares: the example says which
shares it got from which file, and each rank trains on its share.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from orchestrator.bench.launch import with_shares
from orchestrator.bench.shares import SharesDoc, doc_for_setting, shares_helper_file
from orchestrator.inventory import load_inventory_text
from orchestrator.plans import Put
from orchestrator.platforms import PosixShell
from orchestrator.render import Renderer, plan_launch
from orchestrator.steps.launch import prepare_plan
from tests.conftest import BOOTSTRAP, free_port

INVENTORY = """\
cluster:
  name: lab
  master: a
  backend: gloo
  train:
    script: examples/train_ddp.py
    shares: [30, 10, 24]
    env: {{{env}}}
nodes:
  - {{name: a, host: 10.0.0.1, nproc: 2}}
  - {{name: b, host: 10.0.0.2, workdir: /srv/cb}}
"""


def _specs(env: str = "") -> tuple[list, SharesDoc]:  # type: ignore[type-arg]
    inventory = load_inventory_text(INVENTORY.format(env=env), "lab.yaml")
    specs = plan_launch(
        inventory, backend="gloo", master_addr="10.0.0.1", run_id="r1", interfaces={}, cpus={}, pythons={}
    )
    doc = doc_for_setting(inventory.cluster.train.shares, [(s.node.name, s.nproc) for s in specs])
    assert doc is not None
    return with_shares(specs, doc), doc


def test_each_node_gets_the_helper_and_the_shares_beside_its_launch_script() -> None:
    specs, doc = _specs()
    assert doc.shares == [30, 10, 24] and doc.mode == "fixed"
    for spec, run_dir in zip(specs, ["~/cluster-bootstrap/runs/r1/a", "/srv/cb/runs/r1/b"], strict=True):
        plan = prepare_plan(spec.node, PosixShell(), spec, renderer=Renderer())
        puts = {a.target: a for a in plan.actions if isinstance(a, Put)}
        helper, shares = puts[f"{run_dir}/cb_shares.py"], puts[f"{run_dir}/cb_shares.json"]
        assert helper.content() == shares_helper_file().read_bytes() and helper.mode == 0o600
        assert json.loads(shares.content()) == doc.document() and shares.mode == 0o600
        script = Renderer().render(spec, PosixShell())
        assert f"export CB_SHARES_FILE={run_dir}/cb_shares.json" in script.replace("'", "")
        assert f"export CB_SHARES_HELPER={run_dir}/cb_shares.py" in script.replace("'", "")


def test_the_users_own_variables_win() -> None:
    specs, _ = _specs("CB_SHARES_FILE: /data/my_shares.json")
    assert all(s.env["CB_SHARES_FILE"] == "/data/my_shares.json" for s in specs)


def test_a_spec_without_shares_uploads_neither() -> None:
    inventory = load_inventory_text(INVENTORY.format(env=""), "lab.yaml")
    (spec, _) = plan_launch(
        inventory, backend="gloo", master_addr="10.0.0.1", run_id="r1", interfaces={}, cpus={}, pythons={}
    )
    plan = prepare_plan(spec.node, PosixShell(), spec, renderer=Renderer())
    assert not [p for p in plan.uploads if "cb_shares" in p]
    assert "CB_SHARES" not in Renderer().render(spec, PosixShell())


def test_a_local_launch_trains_each_rank_on_its_fixed_share(tmp_path: Path) -> None:
    (tmp_path / "h.yaml").write_text(
        "cluster:\n  name: one\n  master: here\n  backend: gloo\n"
        f"  port: {free_port()}\n"
        "  train:\n    shares: [48, 16]\n"
        '    args: ["--epochs", "1", "--max-steps", "6", "--log-every", "3", "--samples", "2000",\n'
        '           "--global-batch", "64"]\n'
        '    env: {OMP_NUM_THREADS: "1"}\n'
        "nodes:\n  - {name: here, connection: local, nproc: 2, workdir: " + str(tmp_path / "wd") + "}\n"
    )
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1"}
    run = subprocess.run(
        [BOOTSTRAP, "-i", "h.yaml", "launch"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    (said,) = re.findall(r"^\[here:0\] \[rank 0/2\] (shares .*)$", run.stdout, re.M)
    assert said.startswith(f"shares fixed (from {tmp_path}/wd/runs/") and said.endswith(
        "cb_shares.json): [48, 16] of a global batch of 64"
    ), said
    summaries = {
        int(m["rank"]): m
        for m in (json.loads(t) for t in re.findall(r"CB_METRIC (\{.*\})$", run.stdout, re.M))
        if m["kind"] == "summary"
    }
    # 6 steps, 2 of them warm-up: rank 0 trained on 48 samples a step, rank 1 on 16, of 64 each step
    assert summaries[0]["local_samples"] == 4 * 48 and summaries[1]["local_samples"] == 4 * 16
    assert summaries[0]["global_samples"] == summaries[1]["global_samples"] == 4 * 64
    run_dir = next((tmp_path / "wd" / "runs").iterdir()) / "here"
    assert (run_dir / "cb_shares.json").stat().st_mode & 0o777 == 0o600
    assert json.loads((run_dir / "cb_shares.json").read_text())["shares"] == [48, 16]


def test_bench_dry_run_shows_the_probe_script_and_connects_to_nothing(tmp_path: Path) -> None:
    (tmp_path / "h.yaml").write_text(
        "cluster: {name: lab, master: a, backend: gloo}\n"
        "nodes:\n  - {name: a, host: 192.0.2.10, nproc: 2}\n  - {name: b, host: 192.0.2.11}\n"
    )
    argv = [
        sys.executable,
        "-m",
        "orchestrator",
        "-i",
        "h.yaml",
        "bench",
        "--dry-run",
        "--json",
        "--batch-size",
        "32",
    ]
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1"}
    run = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(run.stdout)
    assert doc["command"] == "bench" and doc["dry_run"] is True
    for node in doc["nodes"]:
        assert any(u.endswith(f"/{node['name']}/probe_worker.py") for u in node["uploads"]), node["uploads"]
        assert "probe_worker.py --timeout 60 --batch-size 32 --repeats 5" in node["script"].replace("'", "")
    assert not (tmp_path / "runs").exists()  # nothing reserved, nothing run


def test_attach_shares_fills_every_spec_and_leaves_a_plan_with_unreachable_nodes_alone() -> None:
    from orchestrator.bench.launch import attach_shares
    from orchestrator.errors import UnreachableError
    from orchestrator.executor import Outcome
    from orchestrator.steps.launch import LaunchPlan

    inventory = load_inventory_text(INVENTORY.format(env=""), "lab.yaml")
    specs = plan_launch(
        inventory, backend="gloo", master_addr="10.0.0.1", run_id="r1", interfaces={}, cpus={}, pythons={}
    )
    down = LaunchPlan(
        list(specs), "gloo", "", [Outcome("b", None, UnreachableError("no route", node="b"), 0.1)], []
    )
    # fixed shares need no session; a plan that cannot launch gets nothing (nothing is probed either)
    assert attach_shares(None, inventory, down, "r1") is None  # type: ignore[arg-type]
    assert all(not s.shares_json for s in down.specs)
    up = LaunchPlan(
        list(specs), "gloo", "", [Outcome("a", None, None, 0.1), Outcome("b", None, None, 0.1)], []
    )
    doc = attach_shares(None, inventory, up, "r1")  # type: ignore[arg-type]
    assert doc is not None and doc.shares == [30, 10, 24]
    assert all(json.loads(s.shares_json)["shares"] == [30, 10, 24] for s in up.specs)
    assert [s.env["CB_SHARES_FILE"] for s in up.specs] == [
        "~/cluster-bootstrap/runs/r1/a/cb_shares.json",
        "/srv/cb/runs/r1/b/cb_shares.json",
    ]


def test_the_dry_runs_plan_the_shares_a_launch_ships() -> None:
    """`launch --dry-run` and `render` connect to nothing, yet show the very files and variables
    attach_shares gives a launch; measured shares are shown as not measured yet, with a note."""
    from orchestrator.bench.launch import attach_shares, planned_shares
    from orchestrator.executor import Outcome
    from orchestrator.steps.launch import LaunchPlan

    for setting in ("[30, 10, 24]", "equal"):
        inventory = load_inventory_text(INVENTORY.format(env="").replace("[30, 10, 24]", setting), "lab.yaml")
        specs = plan_launch(
            inventory, backend="gloo", master_addr="10.0.0.1", run_id="r1", interfaces={}, cpus={}, pythons={}
        )
        up = LaunchPlan(list(specs), "gloo", "", [Outcome(s.node.name, None, None, 0.1) for s in specs], [])
        attach_shares(None, inventory, up, "r1")  # type: ignore[arg-type]
        planned, note = planned_shares(inventory, list(specs))
        assert planned == up.specs and note is None, setting
        assert all(json.loads(s.shares_json)["mode"] in ("fixed", "equal") for s in planned), setting
    measured = load_inventory_text(INVENTORY.format(env="").replace("[30, 10, 24]", "measured"), "lab.yaml")
    specs = plan_launch(
        measured, backend="gloo", master_addr="10.0.0.1", run_id="r1", interfaces={}, cpus={}, pythons={}
    )
    planned, note = planned_shares(measured, list(specs))
    shown = json.loads(planned[0].shares_json)
    assert shown["mode"] == "measured" and shown["measured_at"] is None and shown["world_size"] == 3
    assert note is not None and "runs the throughput probe on every rank" in note
    assert planned[1].env["CB_SHARES_FILE"] == "/srv/cb/runs/r1/b/cb_shares.json"


def test_launch_dry_run_and_render_out_show_and_write_the_shares(tmp_path: Path) -> None:
    (tmp_path / "lab.yaml").write_text(INVENTORY.format(env=""))
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1"}
    cli = [sys.executable, "-m", "orchestrator", "-i", "lab.yaml"]
    dry = subprocess.run(
        [*cli, "--json", "launch", "--dry-run", "--run-id", "r1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stdout + dry.stderr
    for node, run_dir in zip(
        json.loads(dry.stdout)["nodes"], ["~/cluster-bootstrap/runs/r1/a", "/srv/cb/runs/r1/b"], strict=True
    ):
        assert f"{run_dir}/cb_shares.json" in node["uploads"] and f"{run_dir}/cb_shares.py" in node["uploads"]
        assert f"export CB_SHARES_FILE={run_dir}/cb_shares.json" in node["script"].replace("'", "")
    rendered = subprocess.run(
        [*cli, "render", "--offline", "--run-id", "r1", "--out", "scripts"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    out = tmp_path / "scripts"
    assert json.loads((out / "cb_shares.json").read_text())["shares"] == [30, 10, 24]
    assert (out / "cb_shares.py").read_bytes() == shares_helper_file().read_bytes()
    assert "copy both to the run directory on each node" in rendered.stderr
    assert "a: ~/cluster-bootstrap/runs/r1/a, b: /srv/cb/runs/r1/b" in rendered.stderr
    assert "CB_SHARES_FILE=/srv/cb/runs/r1/b/cb_shares.json" in (out / "b.sh").read_text().replace("'", "")

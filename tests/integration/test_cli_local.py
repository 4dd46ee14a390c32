"""The real CLI on this machine: the embedded default inventory, bad inventories, usage errors,
and the installed package carrying its templates and default inventory."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from orchestrator.errors import InventoryError
from orchestrator.inventory import load_inventory
from tests.conftest import BOOTSTRAP, free_port

REPO = Path(__file__).resolve().parents[2]
BAD_INVENTORIES = sorted((REPO / "tests" / "unit" / "data" / "inventory").glob("*bad_*.yaml"))


def bootstrap(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "NO_COLOR": "1", **(env or {})}
    full_env.pop("BOOTSTRAP_INVENTORY", None)
    return subprocess.run(
        [BOOTSTRAP, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=full_env,
        stdin=subprocess.DEVNULL,
    )


def spawn(cwd: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """``bootstrap ARGS`` started in the background, its stderr a pipe to read as it comes."""
    return subprocess.Popen(
        [BOOTSTRAP, *args],
        cwd=cwd,
        env={**os.environ, "NO_COLOR": "1", **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_default_inventory_is_this_machine(tmp_path: Path) -> None:
    run = bootstrap("--json", "check", cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["inventory"]["cluster"]["name"] == "local"
    (node,) = doc["nodes"]
    assert node["ok"] and node["via"] == "local"
    # the controller's own interpreter (the script's shebang may name python3 where pytest runs python)
    assert os.path.samefile(node["facts"]["python"]["path"], sys.executable)
    assert node["facts"]["torch"]["installed"] and node["facts"]["torch"]["gloo"]


def test_readme_command_one_checks_then_trains_here(tmp_path: Path) -> None:
    """Plain `bootstrap`: the embedded inventory, the preflight, then the example on 2 CPU ranks."""
    run = bootstrap(cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    assert "embedded default inventory" in run.stderr and "ready to train" in run.stderr
    # one progress line per phase that did work: no "check ok (0.00s)" for facts read once and
    # handed on, no "read check" for reads the session held
    progress = re.findall(r"^local: (.*) ok \(\d+\.\d+s\)$", run.stderr, re.M)
    assert progress == ["check", "validate"], run.stderr
    assert "2 of 2 rank(s) joined" in run.stderr and "all_reduce result correct" in run.stderr
    assert "local (master)" in run.stdout and "(gloo)" in run.stdout
    assert "[local:0] [rank 0/2]" in run.stdout and "[local:1] [rank 1/2]" in run.stdout
    assert "[local:0] done: 3 epochs" in run.stdout
    validation, log_dir = sorted((tmp_path / "runs").iterdir(), key=lambda p: p.name.startswith("local-"))
    assert validation.name.startswith("validate-") and log_dir.name.startswith("local-")
    assert "done: 3 epochs" in (log_dir / "local.log").read_text()


def test_run_streams_locally(tmp_path: Path) -> None:
    run = bootstrap(
        "run", "--env", "GREETING=hi there", "--", "echo $GREETING; exit 3", env={"HOME": str(tmp_path)}
    )
    assert run.returncode == 1
    assert run.stdout.splitlines() == ["[local] hi there"]
    assert "exit 3" in run.stderr


def _load_error(path: Path) -> InventoryError:
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    return info.value


@pytest.mark.parametrize("path", BAD_INVENTORIES, ids=lambda p: p.name)
def test_bad_inventory_gives_located_one_line_errors(path: Path) -> None:
    """Every bad inventory, in-process: the CLI prints each line of the message as one ``error: ``
    line and exits with the error's code (the test below runs the CLI on one of them)."""
    error = _load_error(path)
    assert error.exit_code == 2
    lines = str(error).splitlines()
    assert lines, "no message"
    for line in lines:
        assert line.startswith(f"{path}:"), line  # file and line named on every error


def test_bad_inventory_exits_2_with_located_one_line_errors() -> None:
    path = REPO / "tests" / "unit" / "data" / "inventory" / "bad_many.yaml"  # several errors
    run = bootstrap("--inventory", str(path), "check")
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == len(str(_load_error(path)).splitlines()) > 1, run.stderr  # one line each
    assert "Traceback" not in run.stderr
    for line in lines:
        assert line.startswith(f"error: {path}:"), line  # file and line named on every error


def test_missing_inventory_file() -> None:
    run = bootstrap("--inventory", "/nonexistent/hosts.yaml", "check")
    assert run.returncode == 2
    assert "/nonexistent/hosts.yaml" in run.stderr and "Traceback" not in run.stderr


def test_unknown_node_selection_suggests_the_closest_name(tmp_path: Path) -> None:
    run = bootstrap("--nodes", "locl", "check", env={"HOME": str(tmp_path)})
    assert run.returncode == 2
    assert "locl" in run.stderr and "'local'" in run.stderr


def test_bad_env_name_is_a_usage_error() -> None:
    run = bootstrap("run", "--env", "BAD-NAME=1", "--", "true")
    assert run.returncode == 2
    assert "BAD-NAME" in run.stderr


def test_options_work_before_and_after_the_command(tmp_path: Path) -> None:
    before = bootstrap("--json", "inventory")
    after = bootstrap("inventory", "--json")
    assert before.returncode == after.returncode == 0
    assert json.loads(before.stdout) == json.loads(after.stdout)


def test_wheel_ships_templates_and_default_inventory(tmp_path: Path) -> None:
    """A non-editable install must find templates/ and inventory/local.yaml inside the package."""
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "orchestrator/_data/inventory/local.yaml" in names
    assert "orchestrator/templates/README.md" in names
    assert "orchestrator/facts/probes/torch_facts.py" in names
    assert "orchestrator/steps/probes/validate_worker.py" in names  # uploaded by `bootstrap validate`
    assert "orchestrator/templates/ranks.sh.j2" in names
    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr
    probe = (
        "import orchestrator, orchestrator.resources as r;"
        "print(orchestrator.__file__); print(r.default_inventory()); print(r.templates_dir())"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    package, inventory, templates = out.stdout.splitlines()
    assert (
        package.startswith(str(site)) and inventory.startswith(str(site)) and templates.startswith(str(site))
    )
    assert Path(inventory).is_file() and Path(templates).is_dir()


def test_command_line_inventory_beats_the_environment(tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text("nodes:\n  - {name: elsewhere, host: 192.0.2.1}\n")
    default = REPO / "inventory" / "local.yaml"
    for args in (["-i", str(default), "inventory", "--json"], ["inventory", "-i", str(default), "--json"]):
        run = subprocess.run(
            [BOOTSTRAP, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "BOOTSTRAP_INVENTORY": str(other)},
        )
        assert run.returncode == 0, run.stderr
        assert [n["name"] for n in json.loads(run.stdout)["nodes"]] == ["local"], args
    run = subprocess.run(
        [BOOTSTRAP, "inventory", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "BOOTSTRAP_INVENTORY": str(other)},
    )
    assert [n["name"] for n in json.loads(run.stdout)["nodes"]] == ["elsewhere"]


def test_node_data_is_never_read_as_markup(tmp_path: Path) -> None:
    inv = tmp_path / "h.yaml"
    # node names are host-name characters (issue 14): the markup comes through the other fields
    inv.write_text(
        "cluster: {name: '[bold]lab[/]', master: gpu0}\n"
        "nodes:\n  - {name: gpu0, host: '192.0.2.7', user: 'b[/]', tags: ['[red]x']}\n"
    )
    run = bootstrap("-i", str(inv), "inventory")
    assert run.returncode == 0, run.stderr
    assert "[bold]lab[/]" in run.stdout and "b[/]" in run.stdout and "[red]x" in run.stdout


def _quick_inventory(tmp_path: Path) -> Path:
    script = tmp_path / "quick.py"
    script.write_text("import os\nprint('rank', os.environ['RANK'], 'ran', flush=True)\n")
    inv = tmp_path / "quick.yaml"
    inv.write_text(
        json.dumps(
            {
                "cluster": {
                    "name": "quick",
                    "master": "here",
                    "backend": "gloo",
                    "port": free_port(),  # README command 1 trains on 29500
                    "train": {"script": str(script)},
                },
                "nodes": [{"name": "here", "connection": "local", "python": sys.executable, "nproc": 1}],
            }
        )
    )
    return inv


def test_a_run_id_names_one_run(tmp_path: Path) -> None:
    """A second launch under a run id is refused before anything runs (its log would be appended to
    the first's, and the first's exit code taken for its own): here first, then on the node when this
    directory no longer remembers it."""
    inv = _quick_inventory(tmp_path)
    home = {"HOME": str(tmp_path)}
    first = bootstrap("-i", str(inv), "launch", "--run-id", "r1", cwd=tmp_path, env=home)
    assert first.returncode == 0, first.stderr
    node_log = tmp_path / "cluster-bootstrap" / "runs" / "r1" / "here" / "node.log"
    before = node_log.read_bytes()
    assert node_log.parent.stat().st_mode & 0o777 == 0o700  # launch.sh may hold train.env secrets
    assert b"rank 0 ran" in before

    again = bootstrap("-i", str(inv), "launch", "--run-id", "r1", cwd=tmp_path, env=home)
    assert again.returncode == 2, again.stderr
    assert "run r1 already exists here" in again.stderr and "--run-id" in again.stderr

    (tmp_path / "runs" / "r1" / "run.json").unlink()  # this directory forgot it; the node did not
    again = bootstrap("-i", str(inv), "launch", "--run-id", "r1", cwd=tmp_path, env=home)
    assert again.returncode == 1, again.stderr  # a node refused: as any node failing
    assert "here" in again.stderr and "run r1 already ran on this node" in again.stderr
    assert node_log.read_bytes() == before  # nothing appended, nothing uploaded over it


def test_launch_dry_run_shows_every_nodes_uploads_script_and_command(tmp_path: Path) -> None:
    """`launch --dry-run` connects to nothing and changes nothing; it shows, per node, what would be
    uploaded where, the launch script (secrets masked) and the command that would run it."""
    inv = tmp_path / "win.yaml"
    inv.write_text(
        json.dumps(
            {
                "cluster": {
                    "name": "pcs",
                    "master": "pc1",
                    "backend": "gloo",
                    "train": {"script": "train.py", "env": {"HF_TOKEN": "hf-dry-run-secret-771"}},
                },
                "nodes": [
                    {
                        "name": "pc1",
                        "host": "192.0.2.10",
                        "user": "jo",
                        "os": "windows",
                        "windows": {"mode": "native"},
                    },
                    {
                        "name": "pc2",
                        "host": "192.0.2.11",
                        "user": "jo",
                        "os": "windows",
                        "windows": {"mode": "native"},
                    },
                ],
            }
        )
    )
    home = {"HOME": str(tmp_path / "home"), "WINRM_PASSWORD": "unused"}
    run = bootstrap(
        "-i", str(inv), "--json", "launch", "--dry-run", "--run-id", "dr-1", cwd=tmp_path, env=home
    )
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert (doc["command"], doc["dry_run"], doc["run_id"]) == ("launch", True, "dr-1")
    first, second = doc["nodes"]
    assert first["name"] == "pc1" and first["uploads"][0].endswith("dr-1/pc1/launch.ps1")
    # the shares (equal) the ranks read; train.py is not here: launch uploads nothing for it either
    assert [u.rsplit("/", 1)[1] for u in first["uploads"]] == ["launch.ps1", "cb_shares.py", "cb_shares.json"]
    (command,) = first["commands"]  # the text the node's shell gets: launch.ps1 run with its log
    assert "launch.ps1" in command and "-Log" in command
    assert "RANK" in first["script"] and "hf-dry-run-secret-771" not in run.stdout + run.stderr
    assert second["uploads"][0].endswith("dr-1/pc2/launch.ps1")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "home").exists()

    text = bootstrap("-i", str(inv), "launch", "--dry-run", "--detach", cwd=tmp_path, env=home)
    assert text.returncode == 0, text.stderr
    assert "# ---- pc2 (winrm" in text.stdout
    assert "would run as the login user (start the launcher detached):" in text.stdout
    assert "Win32_Process" in text.stdout
    assert "nothing was uploaded or started" in text.stderr


def test_processes_a_finished_run_left_behind_are_stopped_and_named(tmp_path: Path) -> None:
    """A rank starts a helper and exits 0 without waiting for it (its own session, or not): the run
    ends, and the helpers would hold ports and GPUs unseen (`status` said running forever)."""
    inv = _quick_inventory(tmp_path)
    tag = f"cb-left-{os.getpid()}-{time.time_ns()}"
    (tmp_path / "quick.py").write_text(
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{tag}-own'],"
        " start_new_session=True)\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{tag}-same'])\n"
        "print('leaving', flush=True)\n"
    )
    home = {"HOME": str(tmp_path)}
    run = bootstrap("-i", str(inv), "launch", "--run-id", "left", cwd=tmp_path, env=home)
    try:
        assert run.returncode == 0, run.stderr
        assert (
            "here: the run ended, but processes its ranks started were still running (not waited for "
            "by the training script): stopped 2 process(es)" in run.stderr
        ), run.stderr
        left = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True)
        assert left.stdout == "", left.stdout
        status = bootstrap("-i", str(inv), "--json", "status", "--run", "left", cwd=tmp_path, env=home)
        (node,) = json.loads(status.stdout)["nodes"]
        assert node["state"] == "exited" and node["exit_code"] == 0, node  # it ended with its code
    finally:
        subprocess.run(["pkill", "-f", tag], check=False)


def test_a_node_the_run_did_not_use_is_said_so_from_its_record_before_anything_is_dialled(
    tmp_path: Path,
) -> None:
    """`launch --nodes n1`, then `logs --nodes n2`: n2 was dialled and answered "no run ... on this
    node". The run's record here says n2 was not part of it: a usage error naming its nodes."""
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        "nodes:\n"
        f"  - {{name: n1, connection: local, workdir: {tmp_path / 'wd1'}}}\n"
        "  - {name: n2, host: 192.0.2.1}\n"  # TEST-NET: never reached, whatever happens
    )
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    record = {"run_id": "r1", "nodes": {"n1": {"first_rank": 0, "nproc": 1}}}
    (tmp_path / "runs" / "r1" / "run.json").write_text(json.dumps(record))
    for command in ("logs", "status", "fetch"):
        run = bootstrap(
            "-i",
            str(inv),
            command,
            "--run",
            "r1",
            "--nodes",
            "n2",
            *(["x"] * (command == "fetch")),
            cwd=tmp_path,
        )
        assert run.returncode == 2, run
        assert "n2: not part of run r1 (its nodes: n1)" in run.stderr and "192.0.2.1" not in run.stderr, run
    # the other way round: a node of the run this inventory lacks is said, not silently left out
    record["nodes"]["n9"] = {"first_rank": 1, "nproc": 1}
    (tmp_path / "runs" / "r1" / "run.json").write_text(json.dumps(record))
    status = bootstrap("-i", str(inv), "status", "--run", "r1", cwd=tmp_path)
    assert "n9: part of run r1 but not in this inventory, so not asked" in status.stderr, status
    stop = bootstrap("-i", str(inv), "stop", "--run", "r1", cwd=tmp_path)
    assert "n9: part of run r1 but not in this inventory, so not stopped" in stop.stderr, stop
    logs = bootstrap("-i", str(inv), "logs", "--run", "r1", cwd=tmp_path)
    assert "n9: part of run r1 but not in this inventory, so its log was not read" in logs.stderr, logs


def test_a_run_id_no_node_has_is_named_by_stop_and_fetch_as_status_names_it(tmp_path: Path) -> None:
    """A mistyped --run: `stop` does not say "nothing was running" with exit 0, and `fetch` does not
    blame the file: both say there is no such run on the node (exit 1), as `status` and `logs` do."""
    inv = tmp_path / "hosts.yaml"
    inv.write_text(f"nodes:\n  - {{name: here, connection: local, workdir: {tmp_path / 'wd'}}}\n")
    for command in (["stop", "--run", "nope"], ["fetch", "--run", "nope", "checkpoints/last.pt"]):
        run = bootstrap("-i", str(inv), *command, cwd=tmp_path)
        assert run.returncode == 1, run
        assert "no run nope on this node" in run.stderr, run
        assert "nothing was running" not in run.stderr and "not found in" not in run.stderr, run
        # the node's progress line says so too, not "ok" before the error
        assert f"here: {command[0]} FAILED" in run.stderr and " ok (" not in run.stderr, run
    # fetch's table has the node's row (it was an empty table)
    assert [line.split() for line in run.stdout.splitlines() if "here" in line] == [
        ["│", "here", "│", "-", "│", "failed", "│", "-", "│", "-", "│"]
    ], run


def test_a_foreground_launch_killed_before_it_started_anything_is_a_run_that_never_started(
    tmp_path: Path,
) -> None:
    """The controller was killed (SIGKILL, its machine lost) after it recorded the run and made the
    nodes' run directories, before any launcher started: `status` said "not started", exit 0, as
    for a launch still uploading. The record names its controller; that process is gone."""
    from orchestrator.inventory import load_inventory
    from orchestrator.render import plan_launch
    from orchestrator.runs.layout import read_record, run_dir_for, write_record

    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        "cluster: {name: c, master: here, train: {script: t.py}}\n"
        f"nodes:\n  - {{name: here, connection: local, nproc: 1, workdir: {tmp_path / 'wd'}}}\n"
    )
    inventory = load_inventory(inv)
    specs = plan_launch(
        inventory, backend="gloo", master_addr="127.0.0.1", run_id="cut", interfaces={}, cpus={}, pythons={}
    )
    record = tmp_path / "runs" / "cut"
    write_record(record, "cut", specs, detached=False)  # as the launch does, in this test's process
    Path(run_dir_for(inventory.nodes[0], "cut")).mkdir(parents=True)  # no launcher started there
    status = bootstrap("-i", str(inv), "status", cwd=tmp_path)
    assert status.returncode == 0 and "not started" in status.stdout, status  # its controller lives
    doc = read_record(record)
    assert doc is not None
    dead = subprocess.Popen(["true"])
    dead.wait()
    doc["controller"]["pid"] = dead.pid  # the launch's process, killed
    (record / "run.json").write_text(json.dumps(doc))
    status = bootstrap("-i", str(inv), "status", cwd=tmp_path)
    assert status.returncode == 1, status
    assert "controller lost" in status.stdout, status
    assert "run cut never started" in status.stderr and "launch again" in status.stderr, status


def test_a_launch_refused_everywhere_is_never_the_latest_run(tmp_path: Path) -> None:
    """The master's port is in use: launch is refused before anything starts. That attempt is not
    the run `status`, `logs` and `fetch` then mean by default (a run still holding the port is)."""
    import socket

    (tmp_path / "train.py").write_text("print('hi')\n")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        inv = tmp_path / "hosts.yaml"
        inv.write_text(
            f"cluster: {{port: {port}, train: {{script: train.py}}}}\n"
            f"nodes:\n  - {{name: here, connection: local, python: {sys.executable},"
            f" workdir: {tmp_path / 'wd'}}}\n"
        )
        run = bootstrap("-i", str(inv), "launch", "--run-id", "refused-1", cwd=tmp_path)
    assert run.returncode == 1 and f"port {port} is in use" in run.stderr, run
    record = json.loads((tmp_path / "runs" / "refused-1" / "run.json").read_text())
    assert record["not_started"] is True, record
    status = bootstrap("-i", str(inv), "status", cwd=tmp_path)
    assert status.returncode == 2 and "no runs in" in status.stderr, status
    # asked for by name, it says it never started (it showed "not started", exit 0, with no reason)
    named = bootstrap("-i", str(inv), "status", "--run", "refused-1", cwd=tmp_path)
    assert named.returncode == 1 and "run refused-1 never started: its launch ended" in named.stderr, named


def test_a_skipped_validation_leaves_no_empty_directory(tmp_path: Path) -> None:
    """The second `bootstrap --until validate` finds nothing changed and skips validate: no empty
    runs/validate-*/ is left for each such run (only the one whose workers wrote lines)."""
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        f"cluster: {{port: {free_port()}}}\n"
        f"nodes:\n  - {{name: here, connection: local, python: {sys.executable}, nproc: 1}}\n"
    )
    env = {"HOME": str(tmp_path)}
    first = bootstrap("-i", str(inv), "--until", "validate", cwd=tmp_path, env=env)
    assert first.returncode == 0 and "1 of 1 rank(s) joined" in first.stderr, first
    second = bootstrap("-i", str(inv), "--until", "validate", cwd=tmp_path, env=env)
    assert second.returncode == 0 and "validate: skipped" in second.stderr, second
    (kept,) = (tmp_path / "runs").iterdir()
    assert kept.name.startswith("validate-") and any(kept.iterdir())


def test_the_pipelines_dry_run_names_the_phases_a_real_run_would_leave_out(tmp_path: Path) -> None:
    run = bootstrap("--dry-run", cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert run.returncode == 0, run
    for phase, why in (
        ("sync", "the inventory declares no cluster.env"),
        ("firewall", "one node"),
        ("ntp", "one node"),
    ):
        assert f"--dry-run: {phase} would not run ({why}" in run.stderr, run
    # validate is shown as it would run, and said to be skipped by a real run of an unchanged cluster
    assert "validate: a real run skips it when nothing it checks changed" in run.stderr, run
    forced = bootstrap("--dry-run", "--validate", cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert forced.returncode == 0 and "a real run skips it" not in forced.stderr, forced


def _synced_project(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A project (proj/train.py) synced as code to a local node (workdir wd/), its own cache: the
    inventory, the workdir and the environment to run bootstrap with."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    workdir = tmp_path / "wd"
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        "cluster:\n  code: {source: proj}\n  train: {script: train.py}\n"
        f"nodes:\n  - {{name: here, connection: local, workdir: {workdir}}}\n"
    )
    env = {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    synced = bootstrap("-i", str(inv), "sync", "--only", "code", cwd=tmp_path, env=env)
    assert synced.returncode == 0, synced
    return inv, workdir, env


def test_clean_of_old_runs_only_leaves_the_environment_code_and_newer_runs(tmp_path: Path) -> None:
    """`clean` was everything or nothing (environment, code, every run). --run, --older-than and
    --keep remove only the run directories they choose; a run running that is not chosen stops
    nothing."""
    inv, workdir, env = _synced_project(tmp_path)
    now = time.time()
    # days since each run last wrote its log; a validation after the newest training run is no
    # training run: --keep 1 keeps new-1 (it kept the validation and removed new-1's checkpoints)
    ages = {"old-1": 30, "old-2": 10, "new-1": 0.01, "validate-x": 0.001}
    for run_id, days in ages.items():
        run_dir = workdir / "runs" / run_id / "here"
        (run_dir / "out").mkdir(parents=True)
        (run_dir / "out" / "last.pt").write_bytes(b"w" * 100)
        (run_dir / ("validate_worker.py" if run_id.startswith("validate") else "launch.sh")).write_text("#\n")
        (run_dir / "node.log").write_text(f"{run_id}\n")
        os.utime(run_dir / "node.log", (now - days * 86400, now - days * 86400))
    code = sorted(p.name for p in (workdir / "code").iterdir())
    listed = bootstrap(
        "-i", str(inv), "--json", "clean", "--dry-run", "--older-than", "7d", cwd=tmp_path, env=env
    )
    assert listed.returncode == 0, listed
    (node,) = json.loads(listed.stdout)["nodes"]
    assert [i["kind"] for i in node["items"]] == ["runs"], node  # no env, code, cache
    assert sorted(node["runs"]) == ["old-1", "old-2"], node  # the runs chosen, by name
    # without --outputs, out/ and node.log stay: a second clean of the same runs names none of them
    assert (
        bootstrap("-i", str(inv), "clean", "--yes", "--older-than", "7d", cwd=tmp_path, env=env).returncode
        == 0
    )
    again = bootstrap(
        "-i", str(inv), "--json", "clean", "--dry-run", "--older-than", "7d", cwd=tmp_path, env=env
    )
    assert json.loads(again.stdout)["nodes"][0]["runs"] == [], again
    kept = bootstrap("-i", str(inv), "clean", "--yes", "--keep", "1", "--outputs", cwd=tmp_path, env=env)
    assert kept.returncode == 0, kept
    assert re.search(r"^here: removed runs old-1, old-2, validate-x$", kept.stderr, re.M), kept.stderr
    assert sorted(p.name for p in (workdir / "runs").iterdir()) == ["new-1"]
    assert (workdir / "runs" / "new-1" / "here" / "out" / "last.pt").exists()
    assert sorted(p.name for p in (workdir / "code").iterdir()) == code  # the code stays
    # a run still running that is not chosen stops nothing: this one is chosen alone
    (workdir / "runs" / "new-2" / "here").mkdir(parents=True)
    (workdir / "runs" / "new-2" / "here" / "node.log").write_text("x\n")
    busy = subprocess.Popen(["sleep", "60"], env={"CLUSTER_BOOTSTRAP_RUN": "new-1/here/1-2", "PATH": "/bin"})
    try:
        only = bootstrap("-i", str(inv), "clean", "--yes", "--run", "new-2", cwd=tmp_path, env=env)
    finally:
        busy.kill()
        busy.wait()
    assert only.returncode == 0, only
    assert sorted(p.name for p in (workdir / "runs").iterdir()) == ["new-1"]
    bad = bootstrap("-i", str(inv), "clean", "--older-than", "a week", cwd=tmp_path, env=env)
    assert bad.returncode == 2 and "write a number and a unit" in bad.stderr, bad


def test_fetch_of_a_mistyped_path_names_the_file_meant(tmp_path: Path) -> None:
    """`fetch checkpoint/last.pt` when the run wrote checkpoints/last.pt: "not found", and a hint to
    try the run before, whose own hint named the one before it. The file meant is named instead."""
    inv, workdir, env = _synced_project(tmp_path)
    out = workdir / "runs" / "r1" / "here" / "out" / "checkpoints"
    out.mkdir(parents=True)
    (out / "last.pt").write_bytes(b"w")
    (out.parent.parent / "node.log").write_text("trained\n")
    (tmp_path / "runs" / "r0").mkdir(parents=True)  # an earlier run here: not suggested for a typo
    (tmp_path / "runs" / "r0" / "run.json").write_text("{}")
    run = bootstrap("-i", str(inv), "fetch", "--run", "r1", "checkpoint/last.pt", cwd=tmp_path, env=env)
    assert run.returncode == 1, run
    assert (
        "checkpoint/last.pt not found" in run.stderr
        and "(did you mean checkpoints/last.pt? here has it)" in run.stderr
    )
    assert "--run r0" not in run.stderr, run.stderr


def test_clean_never_removes_through_a_symlink_planted_in_the_code_or_runs_directory(tmp_path: Path) -> None:
    """The code directory's record names what sync shipped; whoever can write that directory (the
    training script, which runs in it) can rewrite it. A record entry through a symlinked directory,
    and a run directory that is a symlink, lead out of the workdir: clean removes nothing there."""
    inv, workdir, env = _synced_project(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "app.conf").write_text("precious\n")
    code = workdir / "code"
    record_path = code / ".bootstrap-code-shipped.json"
    record = json.loads(record_path.read_text())
    record["files"]["sub/app.conf"] = hashlib.sha256(b"precious\n").hexdigest()
    record["files"]["fifo"] = "0" * 64  # a fifo named there: reading it would wait for a writer
    os.mkfifo(workdir / "code" / "fifo")
    record_path.write_text(json.dumps(record))
    (code / "sub").symlink_to(victim)
    # a run directory that is a link to a directory holding what looks like a run of this node
    other = tmp_path / "victim2"
    (other / "here").mkdir(parents=True)
    (other / "here" / "pid").write_text("1\n")
    (other / "here" / "precious.db").write_text("keep\n")
    (workdir / "runs").mkdir()
    (workdir / "runs" / "evil").symlink_to(other)

    listed = bootstrap("-i", str(inv), "--json", "clean", "--dry-run", cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed
    removed = bootstrap("-i", str(inv), "clean", "--yes", cwd=tmp_path, env=env)
    assert removed.returncode == 0, removed
    assert (victim / "app.conf").read_text() == "precious\n"
    assert (other / "here" / "precious.db").read_text() == "keep\n" and (other / "here" / "pid").exists()
    assert not (code / "train.py").exists()  # what sync shipped went


def test_the_past_runs_page_masks_the_inventorys_secrets_in_a_runs_log(tmp_path: Path) -> None:
    """`bootstrap dashboard` (no run live) serves past runs' logs: a train.env secret the run printed
    is masked there as on the live page, when it is set here (literal secret-named values always)."""
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        "cluster:\n  train:\n    env:\n"
        "      HF_TOKEN: {from_env: MY_SECRET_TOK}\n      API_KEY: literal-k3y\n"
        "nodes:\n  - {name: here, connection: local}\n"
    )
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "here.log").write_text("[here:0] token is s3cr3t-VALUE-123 and literal-k3y\n")
    server = spawn(
        tmp_path,
        {"MY_SECRET_TOK": "s3cr3t-VALUE-123"},
        "-i",
        str(inv),
        "dashboard",
        "--listen",
        f"127.0.0.1:{free_port()}",
    )
    try:
        assert server.stderr is not None
        first = server.stderr.readline()
        assert first.startswith("dashboard: http://"), first
        url = first.split("dashboard: ", 1)[1].strip()
        base, token = url.split("?")
        with urllib.request.urlopen(f"{base}api/runs/r1/logs/here?{token}") as answer:
            text = answer.read().decode()
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)
    assert "token is" in text and "s3cr3t" not in text and "literal-k3y" not in text, text


def test_ctrl_c_while_the_cli_loads_is_one_line_and_exit_130() -> None:
    """A Ctrl-C in the first moments (the CLI's imports) printed a traceback."""
    code = (
        "import builtins, orchestrator.cli as cli\n"
        "real = builtins.__import__\n"
        "def importing(name, *args, **kwargs):\n"
        "    if name == 'orchestrator.cli.main':\n"
        "        raise KeyboardInterrupt\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = importing\n"
        "cli.main()\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 130 and run.stderr == "error: interrupted before anything started\n", run


def test_an_upload_a_sync_cut_short_left_is_removed_by_the_next_sync_and_counted_by_clean(
    tmp_path: Path,
) -> None:
    """Ctrl-C while the bundle travels left `.bootstrap-code-upload-*.part` (tens of MB) in the code
    directory for good. The next sync that applies removes a stale one (ten minutes untouched: no sync
    writes it any more); one being written now stays. `clean` lists what is left."""
    inv, workdir, env = _synced_project(tmp_path)
    project = tmp_path / "proj"
    code = workdir / "code"
    stale = code / ".bootstrap-code-upload-0123456789ab.1a2b3c4d.part"
    stale.write_bytes(b"x" * 4096)
    os.utime(stale, (time.time() - 1200, time.time() - 1200))
    listed = bootstrap("-i", str(inv), "--json", "clean", "--dry-run", cwd=tmp_path, env=env)
    (node,) = json.loads(listed.stdout)["nodes"]
    (code_item,) = [i for i in node["items"] if i["kind"] == "code"]
    assert code_item["bytes"] >= 4096, code_item
    fresh = code / ".bootstrap-code-upload-ba9876543210.4d3c2b1a.part"
    fresh.write_bytes(b"y")
    (project / "train.py").write_text("print('hi again')\n")
    synced = bootstrap("-i", str(inv), "sync", "--only", "code", cwd=tmp_path, env=env)
    assert synced.returncode == 0, synced
    assert not stale.exists() and fresh.exists()


def test_a_follow_of_a_run_stop_ended_says_stopped_and_exits_130_as_the_launch_would(tmp_path: Path) -> None:
    """`logs --follow` of a run that `stop --run` ended said "training exited 1" and exit 1 (the
    stop's doing), where a foreground launch says it was stopped and exits 130."""
    (tmp_path / "train.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        f"cluster:\n  port: {free_port()}\n  train: {{script: train.py}}\n"
        f"nodes:\n  - {{name: here, connection: local, workdir: {tmp_path / 'wd'}}}\n"
    )
    env = {"HOME": str(tmp_path)}
    started = bootstrap("-i", str(inv), "launch", "--detach", "--run-id", "held", cwd=tmp_path, env=env)
    assert started.returncode == 0, started
    stopped = bootstrap("-i", str(inv), "stop", "--run", "held", cwd=tmp_path, env=env)
    assert stopped.returncode == 0, stopped
    followed = bootstrap("-i", str(inv), "logs", "--run", "held", "--follow", cwd=tmp_path, env=env)
    assert followed.returncode == 130, followed
    assert "here: training was stopped" in followed.stderr, followed


def test_syncing_a_directory_without_the_training_script_is_refused_as_not_the_project(
    tmp_path: Path,
) -> None:
    """code.source '.' is the current directory: run from elsewhere (the home directory, /tmp), sync
    listed and hashed all of it (180,000 files in /tmp: minutes) and replaced the nodes' code with it.
    The training script not being there refuses the sync, before anything, exit 2."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    inv = project / "hosts.yaml"
    inv.write_text(
        "cluster:\n  code: {source: .}\n  train: {script: train.py}\n"
        f"nodes:\n  - {{name: here, connection: local, workdir: {tmp_path / 'wd'}}}\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"HOME": str(tmp_path)}
    wrong = bootstrap("-i", str(inv), "sync", "--only", "code", cwd=elsewhere, env=env)
    assert wrong.returncode == 2 and "nothing was synced" in wrong.stderr, wrong
    assert not (tmp_path / "wd").exists()
    assert (
        f"the training script train.py is not in {elsewhere}, the directory code sync ships" in wrong.stderr
    )
    right = bootstrap("-i", str(inv), "sync", "--only", "code", "--dry-run", cwd=project, env=env)
    assert right.returncode == 0 and "is not in" not in right.stderr, right


def test_a_file_sync_could_not_write_is_not_recorded_as_shipped_and_clean_keeps_what_training_made(
    tmp_path: Path,
) -> None:
    """Training made a directory ``outputs/`` in the code directory; the project then gets a file of
    that name. The sync cannot write it (and says so): the file is not recorded as one it shipped, so
    nothing later deletes or counts that directory as ours, and `clean` (which had crashed on the
    directory where its record named a file, answering with its raw protocol) lists and removes only
    the project's files, keeping the checkpoint."""
    project, workdir, home = tmp_path / "project", tmp_path / "wd", {"HOME": str(tmp_path)}
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        f"cluster: {{code: {{source: {project}}}, train: {{script: train.py}}}}\n"
        f"nodes:\n  - {{name: here, connection: local, workdir: {workdir}, python: {sys.executable}}}\n"
    )
    assert bootstrap("-i", str(inv), "sync", "--only", "code", cwd=tmp_path, env=home).returncode == 0
    code = workdir / "code"
    (code / "outputs").mkdir()
    (code / "outputs" / "ck.pt").write_text("checkpoint\n")
    (project / "outputs").write_text("x = 1\n")
    failed = bootstrap("-i", str(inv), "sync", "--only", "code", cwd=tmp_path, env=home)
    assert failed.returncode == 1, failed
    assert "outputs: the node has a directory there holding files no sync put there" in failed.stderr, failed
    shipped = json.loads((code / ".bootstrap-code-shipped.json").read_text())["files"]
    assert set(shipped) == {"train.py"}, shipped
    (project / "outputs").unlink()
    assert bootstrap("-i", str(inv), "sync", "--only", "code", cwd=tmp_path, env=home).returncode == 0
    # a file the record names is a directory now (training replaced it): not ours, never read as one
    (code / "train.py").unlink()
    (code / "train.py").mkdir()
    (code / "train.py" / "log.txt").write_text("mine\n")
    listed = bootstrap("-i", str(inv), "--json", "clean", "--dry-run", cwd=tmp_path, env=home)
    assert listed.returncode == 0, listed
    (node,) = json.loads(listed.stdout)["nodes"]
    assert "code" in {item["kind"] for item in node["items"]}, node
    removed = bootstrap("-i", str(inv), "clean", "--yes", cwd=tmp_path, env=home)
    assert removed.returncode == 0, removed
    assert (code / "outputs" / "ck.pt").read_text() == "checkpoint\n"
    assert (code / "train.py" / "log.txt").read_text() == "mine\n"
    assert not (code / ".bootstrap-code-shipped.json").exists()


def test_a_rank_missing_a_module_of_the_project_is_told_to_sync_the_code(tmp_path: Path) -> None:
    """The newcomer adds helper.py and runs `launch`: every rank dies of "No module named 'helper'"
    (launch runs the code the last sync put on the node; without `code:` it ships the script alone).
    The summary says which of those it is and what to run, once however many ranks said it."""
    project, home = tmp_path / "project", {"HOME": str(tmp_path)}
    project.mkdir()
    (project / "train.py").write_text("import helper\nprint('trained', helper.X)\n")
    node = f"{{name: here, connection: local, python: {sys.executable}, nproc: 2"
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        f"cluster: {{port: {free_port()}, code: {{source: {project}}}, train: {{script: train.py}}}}\n"
        f"nodes:\n  - {node}, workdir: {tmp_path / 'wd'}}}\n"
    )
    assert bootstrap("-i", str(inv), "sync", "--only", "code", cwd=project, env=home).returncode == 0
    (project / "helper.py").write_text("X = 1\n")
    stale = bootstrap("-i", str(inv), "launch", cwd=project, env=home)
    assert stale.returncode == 1 and "No module named 'helper'" in stale.stderr, stale
    hint = f"hint: 'helper' is in your project ({project}) but not on the node as it is here"
    # the command to paste acts on this inventory (bare, it synced the embedded local one)
    synced_here = f"`bootstrap -i {inv} sync --only code`"
    assert stale.stderr.count(hint) == 1 and synced_here in stale.stderr, stale.stderr
    assert bootstrap("-i", str(inv), "sync", "--only", "code", cwd=project, env=home).returncode == 0
    synced = bootstrap("-i", str(inv), "launch", cwd=project, env=home)
    assert synced.returncode == 0 and "trained 1" in synced.stdout and "hint:" not in synced.stderr, synced
    # without `code:` launch ships the training script alone
    alone = tmp_path / "alone.yaml"
    alone.write_text(
        f"cluster: {{port: {free_port()}, train: {{script: train.py}}}}\n"
        f"nodes:\n  - {node}, workdir: {tmp_path / 'wd2'}}}\n"
    )
    shipped = bootstrap("-i", str(alone), "launch", cwd=project, env=home)
    assert shipped.returncode == 1, shipped
    beside = "hint: 'helper' is beside the training script here, but launch ships the script alone"
    assert beside in shipped.stderr, shipped.stderr
    assert "`code: {source: .}`" in shipped.stderr, shipped.stderr


def _local_project(tmp_path: Path, train: str) -> tuple[Path, Path, dict[str, str]]:
    """A project (``train.py``, ``helper.py`` with X = 1) that cluster.code syncs to this machine as
    a local node (its own workdir); its inventory, and the HOME to run bootstrap with."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(train)
    (project / "helper.py").write_text("X = 1\n")
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        f"cluster: {{port: {free_port()}, code: {{source: {project}}}, train: {{script: train.py}}}}\n"
        f"nodes:\n  - {{name: here, connection: local, python: {sys.executable}, nproc: 1,"
        f" workdir: {tmp_path / 'wd'}}}\n"
    )
    return project, inv, {"HOME": str(tmp_path)}


def test_a_launch_on_a_declared_environment_never_synced_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    """cluster.env declared and not synced yet: the launch's facts saw no interpreter there, started
    every node anyway, and each failed with "venv/bin/python: not found" (exit 127, a failed run
    recorded). Refused now, naming the nodes, the path and the sync that builds it; no run is left."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        "cluster: {train: {script: train.py}, env: {packages: [tinya==1.0]}}\n"
        f"nodes:\n  - {{name: here, connection: local, workdir: {tmp_path / 'wd'}}}\n"
    )
    refused = bootstrap("-i", str(inv), "launch", cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert refused.returncode == 1, refused
    said = f"here: no environment with torch at {tmp_path / 'wd' / 'venv' / 'bin' / 'python'}"
    assert said in refused.stderr and "nothing was started" in refused.stderr, refused.stderr
    assert f"`bootstrap -i {inv} sync --only env` builds it" in refused.stderr, refused.stderr
    assert "exit 127" not in refused.stdout + refused.stderr
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
    assert not (tmp_path / "wd" / "runs").exists()


def test_launch_says_when_a_nodes_code_directory_is_not_the_project(tmp_path: Path) -> None:
    """A code sync that failed on one node (or was not run after an edit) left it other code than the
    project: launch trained with it and said nothing. It now says so on that node's line, naming the
    files; the training script alone changed (launch uploads it itself) is no such case."""
    project, inv, home = _local_project(tmp_path, "import helper\nprint('trained', helper.X)\n")
    never = bootstrap("-i", str(inv), "launch", cwd=project, env=home)
    # (on the node's own lines, as launch's other notices of what it found there)
    assert "[here] bootstrap: no code sync has put the project in this node's code directory" in never.stdout
    assert bootstrap("-i", str(inv), "sync", "--only", "code", cwd=project, env=home).returncode == 0
    (project / "train.py").write_text("import helper\nprint('trained', helper.X, 'v2')\n")
    script_only = bootstrap("-i", str(inv), "launch", cwd=project, env=home)
    assert script_only.returncode == 0 and "trained 1 v2" in script_only.stdout, script_only
    # (another test's run on this machine may be noticed there: only this notice is looked at)
    assert "is not the project" not in script_only.stdout, script_only.stdout
    (project / "helper.py").write_text("X = 2\n")
    stale = bootstrap("-i", str(inv), "launch", cwd=project, env=home)
    assert stale.returncode == 0 and "trained 1 v2" in stale.stdout, stale  # it ran what the node has
    said = [line for line in stale.stdout.splitlines() if "is not the project" in line]
    assert len(said) == 1 and "1 file(s) differ (helper.py)" in said[0], stale.stdout
    assert said[0].startswith("[here] bootstrap: this node's code directory"), said
    assert f"`bootstrap -i {inv} sync --only code`" in said[0], said  # pasted, it acts on this cluster
    # and again under the summary (amid the ranks' lines it was easy to miss: the run is "ok")
    assert "warning: here: this node's code directory is not the project" in stale.stderr, stale.stderr


def test_stop_names_the_nodes_it_could_not_reach_and_the_stop_to_run_again(tmp_path: Path) -> None:
    """A node whose SSH is down keeps its part of the run: `stop` failed it (exit 3) with the
    connection error alone, and nothing said the run may go on there, nor what to run once it is back."""
    inv = tmp_path / "hosts.yaml"
    inv.write_text(f"nodes:\n  - {{name: ws2, host: 127.0.0.1, port: {free_port()}, user: root}}\n")
    stopped = bootstrap("-i", str(inv), "stop", "--run", "lab-1", cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert stopped.returncode == 3, stopped
    assert "connection refused on 127.0.0.1" in stopped.stderr, stopped.stderr
    assert "set `port:` on the node in the inventory" in stopped.stderr, stopped.stderr
    said = "ws2: not reached, so its part of the run may still be running there; once it answers, run "
    assert said + f"`bootstrap -i {inv} stop --run lab-1` again" in stopped.stderr, stopped.stderr
    # without --run: which run, and that `latest` is one (click only said "Missing option '--run'")
    bare = bootstrap("-i", str(inv), "stop", cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert bare.returncode == 2 and "stop needs the run to stop: --run RUN" in bare.stderr, bare
    assert "`--run latest` is the newest run launched from this directory" in bare.stderr, bare


def test_a_follow_says_at_once_which_node_it_cannot_connect_to_and_keeps_trying(tmp_path: Path) -> None:
    """`logs --follow` with one node's SSH down followed the others and said nothing about it until
    it ended (or gave it up at once, never trying again): it says so at once and keeps trying."""
    import socket

    inv = tmp_path / "hosts.yaml"
    port = free_port()
    inv.write_text(f"nodes:\n  - {{name: ws2, host: 127.0.0.1, port: {port}, user: root}}\n")
    follow = spawn(tmp_path, {"HOME": str(tmp_path)}, "-i", str(inv), "logs", "--run", "lab-1", "--follow")
    try:
        assert follow.stderr is not None
        first = follow.stderr.readline()  # blocks until the note: no sleep
        assert first.startswith("ws2: cannot connect (connection refused on 127.0.0.1"), first
        assert "trying again for up to 300 s, following the others meanwhile" in first, first
        assert follow.poll() is None  # still trying
        # and it really dials again: the node's port answers now, and the follow connects to it (it
        # replayed the first "connection refused" for 300 s, the node back or not)
        with socket.create_server(("127.0.0.1", port)) as back:
            back.settimeout(60)
            dialled, _ = back.accept()
            dialled.close()
    finally:
        follow.send_signal(signal.SIGINT)
        follow.wait(timeout=60)
    assert follow.returncode == 130


def test_a_follow_of_a_run_whose_launch_was_cut_short_before_starting_ends_and_says_so(
    tmp_path: Path,
) -> None:
    """The controller was killed while it uploaded a launch's files: the run directory is there, no
    launcher ever started. `logs --follow` waited for it for good (ten minutes and counting); once the
    directory has not changed for two minutes, it says the run never started there, exit 1."""
    workdir = tmp_path / "wd"
    run_dir = workdir / "runs" / "cut-1" / "here"
    run_dir.mkdir(parents=True, mode=0o700)
    (run_dir / "launch.sh").write_text("#!/bin/sh\n")
    for path in (run_dir / "launch.sh", run_dir):
        os.utime(path, (time.time() - 300, time.time() - 300))
    inv = tmp_path / "hosts.yaml"
    inv.write_text(f"nodes:\n  - {{name: here, connection: local, workdir: {workdir}}}\n")
    followed = bootstrap(
        "-i", str(inv), "logs", "--run", "cut-1", "--follow", cwd=tmp_path, env={"HOME": str(tmp_path)}
    )
    assert followed.returncode == 1, followed
    assert "here: training never started (the launch that prepared it was cut short" in followed.stderr, (
        followed
    )


def test_a_command_without_an_inventory_beside_hosts_yaml_asks_whether_it_was_meant(tmp_path: Path) -> None:
    """A newcomer who forgot `-i` in the project directory ran the embedded local inventory, told only
    to "pass --inventory FILE": the hosts.yaml beside them is named."""
    (tmp_path / "hosts.yaml").write_text("nodes:\n  - {name: ws1, host: 192.0.2.1}\n")
    ran = bootstrap("inventory", cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert "hosts.yaml is here: did you mean `bootstrap -i hosts.yaml ...`?" in ran.stderr, ran


def test_a_local_nodes_commands_run_in_its_home_not_where_bootstrap_was_started(tmp_path: Path) -> None:
    """`connection: local`: node-side Python ran in the directory bootstrap was started from, and
    imported another user's json.py, hashlib.py, base64.py from it (as root). They run in the home
    directory, as an SSH login starts; relative node paths are the home's, as over SSH."""
    home, elsewhere = tmp_path / "home", tmp_path / "shared-scratch"
    home.mkdir()
    elsewhere.mkdir()
    for module in ("json", "hashlib", "base64", "re", "os"):
        (elsewhere / f"{module}.py").write_text(
            f"open({str(tmp_path / 'IMPORTED')!r}, 'a').write('{module}\\n')\n"
        )
    inv = tmp_path / "hosts.yaml"
    inv.write_text(f"nodes:\n  - {{name: here, connection: local, python: {sys.executable}}}\n")
    env = {"HOME": str(home)}
    ran = bootstrap("-i", str(inv), "run", "--", "pwd", cwd=elsewhere, env=env)
    assert ran.returncode == 0 and f"[here] {home}" in ran.stdout, ran
    checked = bootstrap("-i", str(inv), "check", cwd=elsewhere, env=env)
    assert checked.returncode in (0, 1), checked
    synced = bootstrap("-i", str(inv), "clean", "--dry-run", cwd=elsewhere, env=env)
    assert synced.returncode == 0, synced
    assert not (tmp_path / "IMPORTED").exists(), (tmp_path / "IMPORTED").read_text()


def test_a_node_that_takes_the_connection_and_never_speaks_ssh_is_said_so(tmp_path: Path) -> None:
    """A frozen node (its kernel still accepts, its sshd stopped) was "SSH handshake ... failed: No
    existing session": paramiko's words, which point at keys. It says what happened."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (the backlog), says nothing
        port = silent.getsockname()[1]
        inv = tmp_path / "hosts.yaml"
        inv.write_text(f"nodes:\n  - {{name: frozen, host: 127.0.0.1, port: {port}, user: root}}\n")
        run = bootstrap(
            "-i", str(inv), "--connect-timeout", "1", "check", cwd=tmp_path, env={"HOME": str(tmp_path)}
        )
    assert run.returncode == 3, run
    assert (
        f"127.0.0.1:{port} accepted the connection, but its SSH server did not answer within 1s" in run.stderr
    )
    assert "No existing session" not in run.stderr, run.stderr


def test_code_sync_leaves_alone_a_code_directory_a_run_is_running_from(tmp_path: Path) -> None:
    """A detached run trained from the code directory while `bootstrap` (or `sync --only code`)
    rewrote it: its later imports, a restart of its ranks, got the new code, and nothing said so. A
    node where a run works in the code directory is left as it is, naming the run."""
    train = "import helper, time\nprint('started', flush=True)\ntime.sleep(300)\n"
    project, inv, home = _local_project(tmp_path, train)
    assert bootstrap("-i", str(inv), "sync", "--only", "code", cwd=project, env=home).returncode == 0
    started = bootstrap("-i", str(inv), "launch", "--detach", "--run-id", "busy-1", cwd=project, env=home)
    assert started.returncode == 0, started
    try:
        log = tmp_path / "wd" / "runs" / "busy-1" / "here" / "node.log"
        deadline = time.monotonic() + 60
        while "started" not in (log.read_text() if log.exists() else ""):  # the rank is in its code dir
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.1)
        (project / "helper.py").write_text("X = 2\n")
        synced = bootstrap("-i", str(inv), "sync", "--only", "code", cwd=project, env=home)
        assert synced.returncode == 1, synced
        assert "run busy-1 is running from" in synced.stderr and "nothing was written" in synced.stderr
        assert f"`bootstrap -i {inv} stop --run busy-1`" in synced.stderr, synced.stderr
        assert (tmp_path / "wd" / "code" / "helper.py").read_text() == "X = 1\n"
    finally:
        bootstrap("-i", str(inv), "stop", "--run", "busy-1", cwd=project, env=home)
    # another user's process there with a made-up run marker holds nothing up (a stop could not end it)
    fake = subprocess.Popen(
        ["sleep", "300"],
        cwd=tmp_path / "wd" / "code",
        env={"CLUSTER_BOOTSTRAP_RUN": "busy-2/here/1-2"},
        user=54321,
    )
    try:
        after = bootstrap("-i", str(inv), "sync", "--only", "code", cwd=project, env=home)
    finally:
        fake.kill()
        fake.wait()
    assert after.returncode == 0 and (tmp_path / "wd" / "code" / "helper.py").read_text() == "X = 2\n", after


def test_a_detached_launch_refused_for_a_busy_port_is_never_latest(tmp_path: Path) -> None:
    """`launch --detach` typed twice: the second is refused (the first holds the port) but became
    `latest`, so `status` called the first run's nodes "gone" and `stop --run latest` stopped nothing
    while the first trained on. A detached launch refused everywhere never started: not latest."""
    import socket

    port = free_port()
    (tmp_path / "train.py").write_text("print('done', flush=True)\n")
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        f"cluster:\n  port: {port}\n  train: {{script: train.py}}\n"
        f"nodes:\n  - {{name: here, connection: local, workdir: {tmp_path / 'wd'}}}\n"
    )
    env = {"HOME": str(tmp_path)}
    first = bootstrap("-i", str(inv), "launch", "--run-id", "first", cwd=tmp_path, env=env)
    assert first.returncode == 0, first
    with socket.socket() as held:  # what the first run's torchrun would hold
        held.bind(("0.0.0.0", port))
        held.listen()
        refused = bootstrap("-i", str(inv), "launch", "--detach", cwd=tmp_path, env=env)
    assert refused.returncode == 1 and f"port {port} is in use" in refused.stderr, refused
    status = bootstrap("-i", str(inv), "status", cwd=tmp_path, env=env)
    assert status.returncode == 0 and "run first" in status.stdout, status
    assert "never started" in status.stderr, status  # the newer launch, said


def test_launch_keeps_a_training_script_edited_on_the_node_as_code_sync_does(tmp_path: Path) -> None:
    """One `bootstrap` warned "train.py ... the node's own, kept: the node runs with it" (its sync),
    then its launch uploaded the project's over it; a plain `launch` overwrote a hot-fix on a node
    without a word. A script sync or launch put there is replaced; one edited on the node is kept,
    and said, and the run trains with it."""
    inv, workdir, env = _synced_project(tmp_path)
    project, code = tmp_path / "proj", workdir / "code"
    (project / "train.py").write_text("print('project v2')\n")
    first = bootstrap("-i", str(inv), "launch", cwd=tmp_path, env=env)
    assert first.returncode == 0 and "[here:0] project v2" in first.stdout, first
    (project / "train.py").write_text("print('project v3')\n")  # edit, launch again: replaced
    second = bootstrap("-i", str(inv), "launch", cwd=tmp_path, env=env)
    assert second.returncode == 0 and "[here:0] project v3" in second.stdout, second
    (code / "train.py").write_text("print('hot-fix on the node')\n")
    (project / "train.py").write_text("print('project v4')\n")
    kept = bootstrap("-i", str(inv), "launch", cwd=tmp_path, env=env)
    assert kept.returncode == 0 and "[here:0] hot-fix on the node" in kept.stdout, kept
    assert "train.py in " in kept.stdout + kept.stderr and "is the node's own" in kept.stdout + kept.stderr
    assert (code / "train.py").read_text() == "print('hot-fix on the node')\n"
    assert [p.name for p in code.iterdir() if p.name.startswith(".train.py.")] == []  # nothing left beside it
    # `launch --script other.py` between two launches of train.py: train.py stays launch's (its line
    # in the record is kept), not "the node's own" ever after
    (code / "train.py").unlink()  # the hot-fix moved away, as the notice says: the project's goes there
    (project / "other.py").write_text("print('other')\n")
    assert bootstrap("-i", str(inv), "launch", "--script", "other.py", cwd=tmp_path, env=env).returncode == 0
    (project / "train.py").write_text("print('project v5')\n")
    v5 = bootstrap("-i", str(inv), "launch", cwd=tmp_path, env=env)
    assert v5.returncode == 0 and "[here:0] project v5" in v5.stdout, v5
    assert "is the node's own" not in v5.stdout, v5
    # a link or a directory there is the node's own, never followed (a link to a directory had the
    # script written into its target)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (code / "train.py").unlink()
    (code / "train.py").symlink_to(elsewhere)
    linked = bootstrap("-i", str(inv), "launch", cwd=tmp_path, env=env)
    assert "is the node's own" in linked.stdout + linked.stderr and list(elsewhere.iterdir()) == [], linked

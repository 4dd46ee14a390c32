"""Inventory loading: the native format, validation messages, examples, selection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import InventoryError
from orchestrator.inventory import (
    Cluster,
    Inventory,
    Node,
    WinRMSettings,
    _yaml,
    load_inventory,
    load_inventory_text,
)
from orchestrator.inventory._yaml_values import plain

DATA = Path(__file__).parent / "data" / "inventory"
EXAMPLES = Path(__file__).resolve().parents[2] / "inventory"


def issues_of(path: Path) -> str:
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    return str(info.value)


# ----- good files -------------------------------------------------------------------------------------


def test_good_native_merges_defaults_and_node_values() -> None:
    inv = load_inventory(DATA / "good_native.yaml")
    assert inv.format == "native"
    assert inv.cluster == Cluster(name="lab", master="win-a", port=29600, backend="gloo")
    assert [n.name for n in inv.nodes] == ["gpu-linux", "win-a", "192.168.1.102", "wsl-ssh"]

    gpu = inv.node("gpu-linux")
    assert gpu.host == "192.168.1.100"
    assert gpu.port is None
    assert (gpu.os, gpu.connection) == ("linux", "ssh")
    assert gpu.user == "trainer"
    assert gpu.key_file == "~/.ssh/id_ed25519"  # "~" is not expanded
    assert gpu.python == "python3"
    assert gpu.workdir == "~/cluster-bootstrap"
    assert (gpu.gpus, gpu.nproc) == (2, 2)  # nproc defaults to gpus
    assert gpu.tags == ("gpu", "linux")
    assert gpu.address == "192.168.1.100"
    assert gpu.line == 15

    win = inv.node("win-a")
    assert (win.os, win.connection) == ("windows", "winrm")
    assert win.user == "admin"  # node value wins over defaults
    assert win.password_env == "WIN_PASS"
    assert (win.gpus, win.nproc) == (2, 1)
    # winrm merged key by key: scheme from defaults, transport from the node; http -> port 5985
    assert win.winrm == WinRMSettings(transport="kerberos", scheme="http", cert_validation=True)
    assert win.port == 5985
    assert win.address == "192.168.1.101:5985"
    assert win.allow_insecure is True

    unnamed = inv.nodes[2]
    assert unnamed.name == unnamed.host == "192.168.1.102"  # name defaults to host
    assert unnamed.port == 2222
    assert unnamed.interface == "eth1"
    assert unnamed.python == "/opt/py/bin/python3"
    assert (unnamed.gpus, unnamed.nproc) == (0, 1)

    ssh_windows = inv.node("wsl-ssh")
    assert (ssh_windows.os, ssh_windows.connection) == ("windows", "ssh")  # OpenSSH on Windows is fine
    assert ssh_windows.password_prompt is True
    assert ssh_windows.port is None

    assert inv.master_node is win
    assert inv.notes == []


def test_cluster_defaults_to_file_stem_and_first_node() -> None:
    inv = load_inventory(DATA / "good_nat_ports.yaml")
    assert inv.cluster == Cluster(name="good_nat_ports", master="a", port=29500, backend="auto")
    assert [n.address for n in inv.nodes] == ["gateway.lan:2201", "gateway.lan:2202"]


def test_winrm_https_default_port() -> None:
    inv = load_inventory_text("nodes:\n  - {host: w, os: windows}\n", "x.yaml")
    assert inv.nodes[0].port == 5986
    assert inv.nodes[0].winrm == WinRMSettings()


def test_local_node_defaults() -> None:
    inv = load_inventory_text("nodes:\n  - connection: local\n", "here.yaml")
    node = inv.nodes[0]
    assert (node.name, node.host, node.port, node.user) == ("localhost", "localhost", None, None)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_inventory_loads(path: Path) -> None:
    inv = load_inventory(path)
    assert inv.nodes
    json.dumps(inv.public_dict())


def test_example_files_exist() -> None:
    names = {p.name for p in EXAMPLES.glob("*.yaml")}
    assert {"local.yaml", "lab.yaml", "ansible-hosts.yaml"} <= names


def test_embedded_default_is_local_only() -> None:
    inv = load_inventory(EXAMPLES / "local.yaml")
    assert inv.cluster == Cluster(name="local", master="local", port=29500, backend="gloo")
    (node,) = inv.nodes
    assert (node.name, node.connection, node.host, node.gpus, node.nproc) == (
        "local",
        "local",
        "localhost",
        0,
        2,
    )


def test_lab_example() -> None:
    inv = load_inventory(EXAMPLES / "lab.yaml")
    assert inv.master_node.os == "linux" and inv.master_node.gpus == 1
    windows = inv.select(["tag:windows"])
    assert len(windows) == 2
    for node in windows:
        assert (node.connection, node.winrm.scheme, node.password_env) == ("winrm", "https", "WIN_PASS")


# ----- bad files: one per error class, exact line and key words -------------------------------------

BAD = [
    ("bad_unknown_key.yaml", ":7:", ["node 'gpu-linux'", "field 'gpu'", "did you mean 'gpus'"]),
    ("bad_type.yaml", ":4:", ["node 'a'", "field 'gpus'", "expected an integer from 0 to 1024, got 'two'"]),
    ("bad_enum.yaml", ":4:", ["field 'os'", "one of: linux, windows", "'macos'"]),
    ("bad_port.yaml", ":4:", ["field 'port'", "between 1 and 65535", "70000"]),
    ("bad_cluster_port.yaml", ":2:", ["field 'port'", "between 1 and 65535, got 0"]),
    ("bad_cluster_port.yaml", ":3:", ["field 'backend'", "one of: auto, gloo, nccl", "'mpi'"]),
    ("bad_duplicate_name.yaml", ":4:", ["duplicate node name 'worker'", "line 2"]),
    ("bad_duplicate_address.yaml", ":6:", ["node 'b'", "same address 10.0.0.1", "node 'a'"]),
    ("bad_master.yaml", ":2:", ["master 'gpu-linx' is not a node", "did you mean 'gpu-linux'"]),
    ("bad_nproc_gpus.yaml", ":5:", ["field 'nproc'", "each rank needs its own GPU", "nproc <= gpus"]),
    ("bad_nproc_zero.yaml", ":4:", ["field 'nproc'", "expected an integer from 1 to 1024, got 0"]),
    ("bad_gpus_negative.yaml", ":4:", ["field 'gpus'", "expected an integer from 0 to 1024, got -1"]),
    ("bad_local_host.yaml", ":4:", ["node 'here'", "connection 'local'", "192.168.1.50"]),
    ("bad_winrm_linux.yaml", ":4:", ["field 'connection'", "os: windows"]),
    (
        "bad_winrm_insecure.yaml",
        ":7:",
        ["node 'win-lab'", "field 'winrm.cert_validation'", "not checked", "allow_insecure: true"],
    ),
    ("bad_winrm_insecure.yaml", ":12:", ["node 'win-basic'", "field 'winrm.transport'", "clear text"]),
    ("bad_missing_host.yaml", ":4:", ["node 'b'", "field 'host'", "missing"]),
    ("bad_empty_nodes.yaml", ":3:", ["'nodes' is empty"]),
    ("bad_syntax.yaml", ":4:", ["YAML syntax error"]),
    ("bad_top_level.yaml", ":1:", ["expected a mapping at the top level", "got a list"]),
    ("bad_unknown_format.yaml", ":1:", ["unknown inventory format", "'nodes:'", "Ansible"]),
    ("bad_defaults_host.yaml", ":2:", ["'host' cannot be set in defaults"]),
    ("bad_defaults_host.yaml", ":3:", ["field 'gpus'", "got 'many'", "(set in defaults)"]),
]


@pytest.mark.parametrize(("name", "line", "words"), BAD, ids=[f"{b[0]}{b[1]}" for b in BAD])
def test_bad_file_reports_line_and_words(name: str, line: str, words: list[str]) -> None:
    text = issues_of(DATA / name)
    matching = [issue for issue in text.splitlines() if f"{name}{line}" in issue]
    assert matching, text
    assert any(all(w in issue for w in words) for issue in matching), text


def test_insecure_winrm_settings_are_refused_unless_the_node_allows_them() -> None:
    """cert_validation: false and Basic over HTTP need allow_insecure: true on the node (not just a
    warning): without it the inventory does not load (exit 2), whatever command was asked for."""
    with pytest.raises(InventoryError) as info:
        load_inventory(DATA / "bad_winrm_insecure.yaml")
    assert sorted(i.node or "" for i in info.value.issues) == ["win-basic", "win-lab"]  # not win-allowed
    assert info.value.exit_code == 2
    allowed = load_inventory_text(
        "nodes:\n  - {name: w, host: 10.0.0.8, os: windows, allow_insecure: true,\n"
        "     winrm: {transport: basic, scheme: http}}\n"
        "  - {name: v, host: 10.0.0.9, os: windows, winrm: {scheme: http, cert_validation: false}}\n",
        "h.yaml",
    )
    assert [n.name for n in allowed.nodes] == ["w", "v"]  # over HTTP no certificate goes unchecked
    # defaults shared by Windows nodes: every node is named, at the line of the setting
    with pytest.raises(InventoryError) as shared:
        load_inventory_text(
            "defaults:\n  winrm: {cert_validation: false}\nnodes:\n"
            "  - {name: a, host: 10.0.0.1, os: windows}\n  - {name: b, host: 10.0.0.2, os: windows}\n",
            "h.yaml",
        )
    assert [(i.line, i.node, i.field) for i in shared.value.issues] == [
        (2, "a", "winrm.cert_validation"),
        (2, "b", "winrm.cert_validation"),
    ]


def test_every_issue_is_one_line_naming_the_file() -> None:
    for path in sorted(DATA.glob("bad_*.yaml")):
        with pytest.raises(InventoryError) as info:
            load_inventory(path)
        for issue in info.value.issues:
            assert "\n" not in str(issue)
            assert str(issue).startswith(str(path))


def test_all_issues_are_reported_at_once() -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory(DATA / "bad_many.yaml")
    lines = [i.line for i in info.value.issues]
    assert lines == [2, 6, 9, 12]
    text = str(info.value)
    assert "master 'nobody' is not a node" in text
    assert "did you mean 'gpus'" in text
    assert "'mac'" in text
    assert "got 0" in text


def test_defaults_error_is_reported_once_for_all_nodes() -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory(DATA / "bad_defaults_host.yaml")
    assert sum("'many'" in str(i) for i in info.value.issues) == 1


def test_issue_fields_are_structured() -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory(DATA / "bad_unknown_key.yaml")
    (issue,) = info.value.issues
    assert (issue.line, issue.node, issue.field) == (7, "gpu-linux", "gpu")
    assert issue.file == str(DATA / "bad_unknown_key.yaml")


def test_empty_file(tmp_path: Path) -> None:
    text = issues_of(DATA / "bad_empty.yaml")
    assert "empty" in text


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    (issue,) = info.value.issues
    assert issue.line is None
    assert "not found" in str(issue) and str(path) in str(issue)


def test_directory_is_not_an_inventory(tmp_path: Path) -> None:
    text = issues_of(tmp_path)
    assert "directory" in text


def test_unnamed_bad_node_is_called_by_index() -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory_text("nodes:\n  - host: a\n  - 5\n  - gpus: 1\n", "i.yaml")
    text = str(info.value)
    assert "i.yaml:3: node 'nodes[1]'" in text
    assert "i.yaml:4: node 'nodes[2]': field 'host'" in text


def test_winrm_sub_field_typo() -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory_text(
            "nodes:\n  - host: w\n    os: windows\n    winrm:\n      transprt: ntlm\n      scheme: ftp\n",
            "w.yaml",
        )
    text = str(info.value)
    assert "w.yaml:5:" in text and "did you mean 'transport'" in text
    assert "w.yaml:6:" in text and "one of: https, http" in text


def test_cluster_sub_fields_are_reported_on_their_own_lines() -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory_text(
            "cluster:\n"
            "  env:\n"
            "    python: /usr/bin/python3\n"
            "    requirements: 5\n"
            "    linux:\n"
            "      index_url: [1]\n"
            "  firewall:\n"
            "    manage: maybe\n"
            "nodes:\n  - host: a\n",
            "c.yaml",
        )
    text = str(info.value)
    assert "c.yaml:3: field 'env.python': expected a Python version" in text
    assert "c.yaml:4: field 'env.requirements': expected a requirements/lock file path" in text
    assert "c.yaml:6: field 'env.linux.index_url': expected a package index URL, got a list" in text
    assert "c.yaml:8: field 'firewall.manage': expected true or false, got 'maybe'" in text


def test_boolean_is_not_an_integer() -> None:
    with pytest.raises(InventoryError, match="expected an integer from 0 to 1024, got true"):
        load_inventory_text("nodes:\n  - host: a\n    gpus: true\n", "b.yaml")


def test_duplicate_yaml_key_does_not_echo_values() -> None:
    text = "nodes:\n  - host: a\n    password_env: X\n    password_env: Zebra-Secret-77\n"
    with pytest.raises(InventoryError) as info:
        load_inventory_text(text, "d.yaml")
    assert "d.yaml:4:" in str(info.value)
    assert "password_env" in str(info.value)
    assert "Zebra-Secret-77" not in str(info.value)


def test_password_in_password_env_is_not_echoed() -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory_text("nodes:\n  - host: a\n    password_env: 'hunter2 Zebra!'\n", "p.yaml")
    assert "Zebra" not in str(info.value)
    assert "p.yaml:3:" in str(info.value) and "environment variable" in str(info.value)


def test_same_host_with_default_and_explicit_ssh_port_is_a_duplicate() -> None:
    with pytest.raises(InventoryError, match="same address"):
        load_inventory_text("nodes:\n  - {name: a, host: h}\n  - {name: b, host: H, port: 22}\n", "s.yaml")


def test_yaml_merge_keys_keep_lines() -> None:
    text = "nodes:\n  - &base\n    host: a\n    gpus: two\n  - <<: *base\n    host: b\n"
    with pytest.raises(InventoryError) as info:
        load_inventory_text(text, "m.yaml")
    text = str(info.value)
    assert "m.yaml:4: node 'a': field 'gpus'" in text
    assert "m.yaml:4: node 'b': field 'gpus'" in text  # the merged value points at its definition


# ----- Inventory API ------------------------------------------------------------------------------------


@pytest.fixture
def inv() -> Inventory:
    text = """
nodes:
  - {name: gpu-1, host: 10.0.0.1, gpus: 1, tags: [gpu, rack1]}
  - {name: gpu-2, host: 10.0.0.2, gpus: 1, tags: [gpu, rack2]}
  - {name: cpu-1, host: 10.0.0.3, tags: [cpu, rack1]}
  - {name: win-1, host: 10.0.0.4, os: windows, tags: [rack2]}
"""
    return load_inventory_text(text, "api.yaml")


def test_node_lookup_suggests_closest(inv: Inventory) -> None:
    assert inv.node("cpu-1").host == "10.0.0.3"
    with pytest.raises(InventoryError, match=r"unknown node 'cpu1'; did you mean 'cpu-1'\?"):
        inv.node("cpu1")


def test_select_names_globs_tags_commas(inv: Inventory) -> None:
    assert [n.name for n in inv.select(["gpu-*"])] == ["gpu-1", "gpu-2"]
    assert [n.name for n in inv.select(["tag:rack1"])] == ["gpu-1", "cpu-1"]
    assert [n.name for n in inv.select(["win-1,gpu-1", "gpu-1"])] == ["gpu-1", "win-1"]
    assert [n.name for n in inv.select(["tag:rack2, cpu-1"])] == ["gpu-2", "cpu-1", "win-1"]
    assert inv.select([]) == []


def test_select_unknown_patterns_all_reported(inv: Inventory) -> None:
    with pytest.raises(InventoryError) as info:
        inv.select(["gpu-3,tag:rak1", "cpu-1"])
    text = str(info.value)
    assert "no node matches 'gpu-3'; did you mean 'gpu-1'?" in text or "did you mean 'gpu-2'" in text
    assert "no node has tag 'rak1'; did you mean 'tag:rack1'?" in text
    assert len(info.value.issues) == 2


def test_an_empty_selection_is_an_error_not_nothing_to_do(inv: Inventory) -> None:
    """`--nodes "$NODES"` with the variable empty: a script must not read "stopped" from no nodes."""
    for patterns in ([""], [" , "], ["", ","]):
        with pytest.raises(InventoryError, match="names no node"):
            inv.select(patterns)
    assert inv.select([]) == []  # no --nodes at all: the caller means every node
    assert [n.name for n in inv.select(["gpu-1,"])] == ["gpu-1"]


def test_an_empty_name_between_commas_is_an_error_not_one_node_fewer(inv: Inventory) -> None:
    """`--nodes "gpu-1,$GONE,cpu-1"` with the variable unset: a job on two nodes instead of three
    would start without a word."""
    for raw in ("gpu-1,,cpu-1", ",gpu-1", "gpu-1, ,cpu-1"):
        with pytest.raises(InventoryError, match="has an empty name between commas") as info:
            inv.select([raw])
        assert repr(raw) in str(info.value)


def test_public_dict_is_json_safe(inv: Inventory) -> None:
    data = inv.public_dict()
    text = json.dumps(data)
    assert data["format"] == "native"
    assert data["cluster"]["master"] == "gpu-1"
    assert data["nodes"][3]["address"] == "10.0.0.4:5986"
    assert data["nodes"][0]["tags"] == ["gpu", "rack1"]
    assert "api.yaml" in text


def test_node_is_frozen_and_hashable(inv: Inventory) -> None:
    node = inv.nodes[0]
    with pytest.raises(ValueError):
        node.gpus = 3  # type: ignore[misc]
    assert len({*inv.nodes, *inv.nodes}) == 4


def test_node_constructed_directly_resolves_defaults() -> None:
    node = Node(name="w", host="h", os="windows", gpus=2)
    assert (node.connection, node.port, node.nproc) == ("winrm", 5986, 2)
    assert Node(name="v6", host="fe80::1", port=22).address == "[fe80::1]:22"


names_st = st.lists(
    st.from_regex(r"[a-z][a-z0-9-]{0,6}", fullmatch=True), min_size=1, max_size=8, unique=True
)


@settings(max_examples=60, deadline=None)
@given(names=names_st, data=st.data())
def test_select_keeps_inventory_order_without_duplicates(names: list[str], data: st.DataObject) -> None:
    nodes = [Node(name=n, host=f"10.0.0.{i + 1}", tags=(f"t{i % 3}",)) for i, n in enumerate(names)]
    inv = Inventory(
        cluster=Cluster(name="h", master=names[0]), nodes=nodes, source="h.yaml", format="native", notes=[]
    )
    picked = data.draw(st.lists(st.sampled_from([*names, "tag:t0", "*"]), min_size=1, max_size=6))
    joined = data.draw(st.booleans())
    patterns = [",".join(picked)] if joined else picked
    result = inv.select(patterns)
    result_names = [n.name for n in result]
    assert len(result_names) == len(set(result_names))
    assert result_names == [n for n in names if n in set(result_names)]
    for pattern in picked:
        if pattern == "*":
            assert result_names == names
        elif pattern.startswith("tag:"):
            assert {n.name for n in nodes if "t0" in n.tags} <= set(result_names)
        else:
            assert pattern in result_names


def test_bad_host_without_name_is_reported_once() -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory_text("nodes:\n  - host: 'bad host'\n", "h.yaml")
    (issue,) = info.value.issues
    assert (issue.line, issue.field) == (2, "host")


# -- windows: where training runs on a Windows node ----------------------------------------------------


def test_windows_mode_defaults_to_wsl_and_merges_from_defaults() -> None:
    from orchestrator.inventory.model import WindowsSettings

    inv = load_inventory_text(
        "defaults:\n  windows: {distro: Ubuntu-22.04}\n"
        "nodes:\n"
        "  - {name: lin, host: 10.0.0.1}\n"
        "  - {name: w1, host: 10.0.0.2, os: windows}\n"
        "  - {name: w2, host: 10.0.0.3, os: windows, windows: {mode: native}}\n"
        "  - {name: w3, host: 10.0.0.4, os: windows, windows: {wsl_user: trainer}}\n",
        "w.yaml",
    )
    assert inv.node("w1").windows == WindowsSettings(mode="wsl", distro="Ubuntu-22.04")
    assert inv.node("w2").windows == WindowsSettings(mode="native", distro="Ubuntu-22.04")
    assert inv.node("w3").windows == WindowsSettings(distro="Ubuntu-22.04", wsl_user="trainer")
    public = inv.public_dict()["nodes"][1]["windows"]
    assert public == {"mode": "wsl", "distro": "Ubuntu-22.04", "wsl_user": None}


def test_windows_settings_mistakes_are_named() -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory_text(
            "nodes:\n"
            "  - host: w\n    os: windows\n    windows:\n      mode: wls\n      distro: 'my distro'\n"
            "      wsl_usr: me\n"
            "  - {host: l, windows: {mode: native}}\n",
            "w.yaml",
        )
    text = str(info.value)
    assert "w.yaml:5: node 'w': field 'windows.mode': expected one of: wsl, native" in text
    assert "w.yaml:6: node 'w': field 'windows.distro'" in text and "'my distro'" in text
    assert "w.yaml:7: node 'w': field 'windows.wsl_usr': unknown field 'wsl_usr'" in text
    assert "did you mean 'wsl_user'" in text
    assert "node 'l': field 'windows': 'windows' (mode, distro, wsl_user) is only for os: windows" in text


def test_ansible_bootstrap_windows_vars() -> None:
    inv = load_inventory_text(
        "all:\n  children:\n    win:\n      vars:\n        ansible_connection: winrm\n"
        "        bootstrap_windows_mode: wsl\n        bootstrap_wsl_distro: Ubuntu\n"
        "      hosts:\n        pc1:\n        pc2:\n          bootstrap_windows_mode: native\n"
        "    linux:\n      hosts:\n        box:\n",
        "a.yaml",
    )
    assert (inv.node("pc1").windows.mode, inv.node("pc1").windows.distro) == ("wsl", "Ubuntu")
    assert inv.node("pc2").windows.mode == "native"
    with pytest.raises(InventoryError) as info:
        load_inventory_text("all:\n  hosts:\n    box:\n      bootstrap_wsl_distro: Ubuntu\n", "a.yaml")
    assert "only for os: windows nodes" in str(info.value)


# ----- hostile input: each limit ends in one issue naming the file (the CLI: exit 2, no traceback) -------
# Before the limits, each of these hung with memory growing past 1 GB, blocked forever, or ended in a
# traceback. The timeout marks only guard against such a hang; no test measures time (see
# benchmarks/inventory_load.py).


def alias_bomb(indent: str = "") -> str:
    """Nine levels of nine-fold aliases: ``*l8`` stands for 9**9 (387 million) strings."""
    lines = [f"{indent}l0: &l0 [{', '.join(['lol'] * 9)}]"]
    lines += [f"{indent}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


@pytest.fixture(params=["libyaml", "python"])
def loader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both PyYAML parsers: libyaml's (the default) and the pure-Python one (where libyaml is missing)."""
    if request.param == "python":
        monkeypatch.setattr(_yaml, "_LOADER", _yaml._PyLoader)
    elif getattr(_yaml, "_CLoader", None) is None:
        pytest.skip("PyYAML without libyaml")
    return str(request.param)


def only_issue(text: str, source: str = "h.yaml") -> str:
    with pytest.raises(InventoryError) as info:
        load_inventory_text(text, source)
    (issue,) = info.value.issues
    assert str(issue).startswith(source) and "\n" not in str(issue)
    return str(issue)


@pytest.mark.timeout(60)
def test_alias_bomb_is_refused(loader: str) -> None:
    text = "anchors:\n" + alias_bomb("  ") + "nodes:\n  - host: a\n    tags: *l8\n"
    issue = only_issue(text)
    assert issue.startswith("h.yaml:") and f"more than {_yaml.MAX_ALIAS_VALUES} values" in issue
    assert "billion laughs" in issue


def test_aliases_and_merge_keys_within_the_limit_are_read() -> None:
    # a few hundred merges of shared settings: far below MAX_ALIAS_VALUES
    hosts = "".join(f"  - {{<<: *d, name: n{i}, host: 10.0.{i // 250}.{i % 250 + 1}}}\n" for i in range(600))
    text = f"nodes:\n  - &d {{host: 10.9.9.9, user: u, tags: [a, b]}}\n{hosts}"
    inv = load_inventory_text(text, "m.yaml")
    assert len(inv.nodes) == 601 and inv.nodes[-1].tags == ("a", "b") and inv.nodes[-1].user == "u"
    assert inv.nodes[-1].host == "10.0.2.100"  # written in the mapping: wins over the merged value


def test_an_alias_loop_is_refused(loader: str) -> None:
    assert "refers to the mapping or list that contains it" in only_issue("nodes: &a [*a]\n")


@pytest.mark.timeout(60)
def test_deep_nesting_is_refused(loader: str) -> None:
    issue = only_issue("nodes: " + "[" * 500 + "]" * 500 + "\n")
    assert issue.startswith("h.yaml:1: ") and f"nested more than {_yaml.MAX_DEPTH} levels" in issue
    unclosed = only_issue("nodes:\n" + "[" * 500 + "\n")  # a syntax error or the depth, one line either way
    assert unclosed.startswith("h.yaml:")


def test_nesting_up_to_the_limit_is_read(loader: str) -> None:
    lists = _yaml.MAX_DEPTH - 1  # inside the top-level mapping
    nested: list[object] = []
    for _ in range(lists - 1):
        nested = [nested]
    assert _yaml.load_yaml("a: " + "[" * lists + "]" * lists + "\n", "d.yaml") == {"a": nested}
    deeper = "a: " + "[" * (lists + 1) + "]" * (lists + 1) + "\n"
    with pytest.raises(InventoryError, match=f"nested more than {_yaml.MAX_DEPTH} levels"):
        _yaml.load_yaml(deeper, "d.yaml")


@pytest.mark.timeout(60)
def test_huge_integer_is_refused(loader: str) -> None:
    issue = only_issue("nodes:\n  - host: a\n    gpus: " + "1" * 100_000 + "\n")
    assert issue == "h.yaml:3: an integer of 100000 digits (at most 30 are read): quote it if it is text"
    assert "0x" + "f" * 40 not in only_issue("nodes:\n  - host: a\n    gpus: 0x" + "f" * 40 + "\n")
    inv = load_inventory_text("nodes:\n  - host: a\n    name: '" + "1" * 100 + "'\n", "q.yaml")
    assert inv.nodes[0].name == "1" * 100  # quoted: text


@pytest.mark.timeout(60)
def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "hosts.yaml"
    os.mkfifo(fifo)
    with pytest.raises(InventoryError) as info:
        load_inventory(fifo)  # opening a FIFO with no writer would block forever
    (issue,) = info.value.issues
    assert (
        str(issue)
        == f"{fifo}: is a FIFO (named pipe), not a regular file: give the path of an inventory file"
    )


@pytest.mark.timeout(60)
@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_device_is_refused_without_reading() -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory("/dev/zero")  # endless: reading it would fill the memory
    (issue,) = info.value.issues
    assert str(issue).startswith("/dev/zero: is a character device, not a regular file")


@pytest.mark.timeout(60)
def test_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    head = "nodes:\n  - host: a\n"
    padding = ("#" * 99 + "\n") * ((_yaml.MAX_FILE_BYTES - len(head)) // 100 + 1)
    path.write_text(head + padding)  # a valid inventory, one comment line over the limit
    assert path.stat().st_size > _yaml.MAX_FILE_BYTES
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    (issue,) = info.value.issues
    size = path.stat().st_size
    assert str(issue).startswith(f"{path}: the inventory file has {size} bytes, over the 4 MiB limit")
    assert "over the 4 MiB limit" in only_issue(head + padding)  # the text API too


def inventory_of_about(size: int) -> str:
    parts = ["cluster:\n  name: big\n  backend: gloo\ndefaults:\n  user: trainer\nnodes:\n"]
    total = count = 0
    while total < size:
        entry = (
            f"  - name: node-{count:05d}\n    host: 10.{count // 65536}.{count // 256 % 256}.{count % 256}\n"
            f"    gpus: {count % 3}\n    tags: [rack{count // 40:03d}, {'gpu' if count % 3 else 'cpu'}]\n"
        )
        parts.append(entry)
        total += len(entry)
        count += 1
    return "".join(parts)


def test_a_one_megabyte_inventory_loads(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(inventory_of_about(1_000_000))
    assert 1_000_000 <= path.stat().st_size < _yaml.MAX_FILE_BYTES
    inv = load_inventory(path)
    assert len(inv.nodes) > 10_000
    last = inv.nodes[-1]
    assert last.line == len(path.read_text().splitlines()) - 3  # node marks still give lines
    assert last.gpus == int(last.name.rsplit("-", 1)[1]) % 3


def test_native_format_keeps_yaml_1_2_meanings() -> None:
    data = plain(_yaml.load_yaml("nodes:\n  - tags: [yes, no, on, off, 0777, 1:20, true]\n", "n.yaml"))
    assert data["nodes"][0]["tags"] == ["yes", "no", "on", "off", 777, "1:20", True]


def test_one_line_and_exit_2_from_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text("anchors:\n" + alias_bomb("  ") + "nodes:\n  - host: a\n    tags: *l8\n")
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "-i", str(path), "inventory"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and str(path) in lines[0] and "billion laughs" in lines[0], proc.stderr


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("host: '--service=x'", "host"),  # an option of ssh or getent
        ("host: '-oProxyCommand=touch /tmp/p'", "host"),
        ('host: "a\\0b"', "host"),  # NUL: the name checked is not the name dialled
        ('host: "a\'b"', "host"),
        ("host: 'a$(id)'", "host"),
        ('user: "x\\ntouch /tmp/p #"', "user"),  # a line of its own in dry-run headers
        ('workdir: "/srv/a\\rb"', "workdir"),
        ('python: "/usr/bin/python3\\0x"', "python"),
    ],
)
def test_words_that_reach_command_lines_refuse_options_and_control_characters(line: str, field: str) -> None:
    text = "nodes:\n  - name: a\n    " + (line if line.startswith("host") else "host: a\n    " + line) + "\n"
    with pytest.raises(InventoryError) as info:
        load_inventory_text(text, "w.yaml")
    assert f"field '{field}'" in str(info.value)


def test_hosts_keep_names_addresses_and_ipv6_zones() -> None:
    inv = load_inventory_text(
        "nodes:\n  - {name: a, host: gpu-1.lab.example}\n  - {name: b, host: 192.168.1.10}\n"
        "  - {name: c, host: 'fe80::1%eth0'}\n  - {name: d, host: my_ssh_alias}\n",
        "h.yaml",
    )
    assert [n.host for n in inv.nodes] == [
        "gpu-1.lab.example",
        "192.168.1.10",
        "fe80::1%eth0",
        "my_ssh_alias",
    ]


def test_a_relative_training_script_stays_in_the_project() -> None:
    for script in ("../../.ssh/authorized_keys", "src/../../x.py", "..\\\\evil.py"):
        with pytest.raises(InventoryError, match=r"field 'train.script'.*leaves the code directory"):
            load_inventory_text(
                f"cluster: {{train: {{script: '{script}'}}}}\nnodes: [{{host: a}}]\n", "s.yaml"
            )
    for script in ("train.py", "src/train.py", "/opt/project/train.py", "my..script.py"):
        inv = load_inventory_text(
            f"cluster: {{train: {{script: '{script}'}}}}\nnodes: [{{host: a}}]\n", "s.yaml"
        )
        assert inv.cluster.train.script == script


def test_an_ntp_server_is_never_an_option() -> None:
    with pytest.raises(InventoryError, match=r"field 'time.servers'.*'-x.org' is not a host name"):
        load_inventory_text("cluster: {time: {servers: [-x.org]}}\nnodes: [{host: a}, {host: b}]\n", "t.yaml")

"""Ansible YAML inventories: mapping to nodes, precedence, tags, notes and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import InventoryError
from orchestrator.inventory import Inventory, WinRMSettings, load_inventory, load_inventory_text
from orchestrator.inventory._yaml import MAX_ALIAS_VALUES, load_yaml
from orchestrator.inventory._yaml_values import plain
from orchestrator.inventory.ansible_hosts import MAX_RANGE_HOSTS

DATA = Path(__file__).parent / "data" / "inventory"


@pytest.fixture(scope="module")
def inv() -> Inventory:
    return load_inventory(DATA / "ansible_good.yaml")


def test_format_and_host_order(inv: Inventory) -> None:
    assert inv.format == "ansible"
    # first appearance in the file: g2 (under gpu.children.bigmem) comes before g1 (gpu.hosts)
    assert [n.name for n in inv.nodes] == ["head", "g2", "g1", "win1", "win2"]
    assert inv.node("g2").line == 22


def test_cluster_settings_from_all_vars(inv: Inventory) -> None:
    assert inv.cluster.name == "ansible_good"  # file stem
    assert inv.cluster.port == 29555
    assert inv.cluster.backend == "gloo"
    assert inv.cluster.master == "g2"  # first host of group "masters"


def test_plain_mapping(inv: Inventory) -> None:
    head = inv.node("head")
    assert (head.host, head.port, head.user, head.os, head.connection) == (
        "10.0.0.10",
        None,
        "trainer",
        "linux",
        "ssh",
    )
    g1 = inv.node("g1")
    assert (g1.host, g1.port, g1.address) == ("10.0.0.11", 2222, "10.0.0.11:2222")


def test_precedence(inv: Inventory) -> None:
    # all < parent < child < host; later sibling group wins
    assert inv.node("head").gpus == 1  # all
    g1 = inv.node("g1")
    assert g1.gpus == 2  # gpu over all
    assert g1.user == "late"  # zz_late defined after gpu, same depth
    g2 = inv.node("g2")
    assert g2.gpus == 4  # bigmem (child of gpu) over gpu
    assert g2.nproc == 2  # host var
    assert g2.user == "gpuuser"


def test_tags_are_groups(inv: Inventory) -> None:
    assert inv.node("head").tags == ()
    assert inv.node("g2").tags == ("gpu", "bigmem", "masters")
    assert inv.node("g1").tags == ("gpu", "zz_late")
    assert [n.name for n in inv.select(["tag:gpu"])] == ["g2", "g1"]


def test_windows_hosts(inv: Inventory) -> None:
    for name in ("win1", "win2"):  # expanded from win[1:2]
        node = inv.node(name)
        assert (node.os, node.connection) == ("windows", "winrm")
        assert node.winrm == WinRMSettings(transport="credssp", scheme="http", cert_validation=False)
        assert node.port == 5985
        assert node.password_env == "WIN_PASS"  # from "{{ lookup("env","WIN_PASS") }}"
        assert node.allow_insecure is True


def test_notes_for_ignored_variables(inv: Inventory) -> None:
    assert "ignored ansible_become on hosts head, g2, g1, win1, win2 (not used by bootstrap)" in inv.notes
    assert any(n.startswith("ignored ntp_server on hosts") for n in inv.notes)
    assert "ignored ansible_host_unused_key on hosts win1, win2 (not used by bootstrap)" in inv.notes
    assert len([n for n in inv.notes if "ansible_become" in n]) == 1  # one note per key name


def test_single_host_note_wording() -> None:
    inv = load_inventory_text("all:\n  hosts:\n    web1:\n      ansible_become: true\n", "n.yaml")
    assert inv.notes == ["ignored ansible_become on host web1 (not used by bootstrap)"]


BAD = [
    (
        "ansible_bad_bootstrap_key.yaml",
        ":7:",
        ["node 'web1'", "bootstrap_gpu", "did you mean 'bootstrap_gpus'"],
    ),
    (
        "ansible_bad_vault.yaml",
        ":5:",
        ["vault-encrypted values are not supported; use bootstrap_password_env"],
    ),
    ("ansible_bad_template.yaml", ":3:", ["ansible_user", "templating is not evaluated"]),
    ("ansible_bad_connection.yaml", ":4:", ["unsupported connection 'docker'", "winrm"]),
    ("ansible_bad_cluster_var.yaml", ":5:", ["bootstrap_master", "vars of group 'all'"]),
    ("ansible_bad_group_key.yaml", ":2:", ["unknown key 'host'", "did you mean 'hosts'"]),
    (
        "ansible_bad_winrm_insecure.yaml",
        ":7:",
        ["node 'win1'", "field 'ansible_winrm_server_cert_validation'", "bootstrap_allow_insecure: true"],
    ),
]


@pytest.mark.parametrize(("name", "line", "words"), BAD, ids=[b[0] for b in BAD])
def test_bad_ansible_file(name: str, line: str, words: list[str]) -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory(DATA / name)
    text = str(info.value)
    assert any(f"{name}{line}" in i and all(w in i for w in words) for i in text.splitlines()), text


def test_group_var_issue_reported_once() -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory(DATA / "ansible_bad_template.yaml")
    assert len(info.value.issues) == 1  # shared by web1 and web2, reported once


def test_bad_values_map_to_lines() -> None:
    text = """all:
  hosts:
    w1:
      ansible_port: 99999
      bootstrap_os: mac
      bootstrap_gpus: 1
      bootstrap_nproc: 2
      ansible_winrm_server_cert_validation: maybe
"""
    with pytest.raises(InventoryError) as info:
        load_inventory_text(text, "v.yaml")
    out = str(info.value)
    assert "v.yaml:4: node 'w1': field 'ansible_port': expected an integer between 1 and 65535" in out
    assert "v.yaml:5: node 'w1': field 'bootstrap_os': expected one of: linux, windows, got 'mac'" in out
    assert "v.yaml:7: node 'w1': field 'bootstrap_nproc'" in out and "each rank needs its own GPU" in out
    assert "v.yaml:8:" in out and "'validate' or 'ignore'" in out


def test_master_fallbacks_and_explicit() -> None:
    first = load_inventory_text("all:\n  hosts:\n    a:\n    b:\n", "m.yaml")
    assert first.cluster.master == "a"
    explicit = load_inventory_text(
        "all:\n  vars:\n    bootstrap_master: b\n  hosts:\n    a:\n    b:\n", "m.yaml"
    )
    assert explicit.cluster.master == "b"
    with pytest.raises(
        InventoryError, match=r"m\.yaml:3: field 'bootstrap_master': master 'bb' is not a node"
    ):
        load_inventory_text("all:\n  vars:\n    bootstrap_master: bb\n  hosts:\n    a:\n", "m.yaml")


def test_connection_and_os_mapping() -> None:
    text = """all:
  hosts:
    p: {ansible_connection: paramiko}
    s: {ansible_connection: smart}
    loc: {ansible_connection: local}
    fam: {ansible_os_family: Windows, ansible_connection: ssh}
    win: {ansible_connection: winrm, ansible_winrm_transport: plaintext, ansible_winrm_ca_trust_path: /ca}
    py: {ansible_python_interpreter: auto_silent}
"""
    inv = load_inventory_text(text, "c.yaml")
    got = {n.name: (n.os, n.connection) for n in inv.nodes}
    assert got == {
        "p": ("linux", "ssh"),
        "s": ("linux", "ssh"),
        "loc": ("linux", "local"),
        "fam": ("windows", "ssh"),
        "win": ("windows", "winrm"),
        "py": ("linux", "ssh"),
    }
    assert inv.node("loc").host == "localhost"  # like Ansible: the inventory name is only a name here
    assert inv.node("win").winrm.transport == "basic"
    assert inv.node("win").winrm.ca_bundle == "/ca"
    assert inv.node("py").python is None


def test_local_connection_needs_a_local_host() -> None:
    text = "all:\n  hosts:\n    buildbox:\n      ansible_connection: local\n      ansible_host: 10.0.0.5\n"
    with pytest.raises(
        InventoryError, match=r"l\.yaml:5: node 'buildbox': field 'ansible_host': connection 'local'"
    ):
        load_inventory_text(text, "l.yaml")
    inv = load_inventory_text("all:\n  hosts:\n    buildbox:\n      ansible_connection: local\n", "l.yaml")
    assert (inv.nodes[0].name, inv.nodes[0].host, inv.nodes[0].connection) == (
        "buildbox",
        "localhost",
        "local",
    )


def test_host_port_suffix_and_ranges() -> None:
    text = "all:\n  hosts:\n    db-[a:c]:5555:\n    web[01:05:2]:\n"
    inv = load_inventory_text(text, "r.yaml")
    assert [n.address for n in inv.nodes] == [
        "db-a:5555",
        "db-b:5555",
        "db-c:5555",
        "web01",
        "web03",
        "web05",
    ]


def test_unsupported_winrm_transport() -> None:
    text = "all:\n  hosts:\n    w:\n      ansible_connection: winrm\n      ansible_winrm_transport: [magic]\n"
    with pytest.raises(InventoryError, match=r"r\.yaml:5: .*no supported WinRM transport.*ntlm"):
        load_inventory_text(text, "r.yaml")


def test_hosts_as_list_is_explained() -> None:
    with pytest.raises(InventoryError, match="not '- web1'"):
        load_inventory_text("all:\n  hosts:\n    - web1\n", "l.yaml")


def test_children_loop_is_reported() -> None:
    text = "all:\n  children:\n    a:\n      children:\n        b:\n          children:\n            a:\n"
    with pytest.raises(InventoryError, match="children loop"):
        load_inventory_text(text, "loop.yaml")


def test_plain_variable_named_like_a_setting_gets_a_hint() -> None:
    inv = load_inventory_text("all:\n  vars:\n    gpus: 2\n  hosts:\n    a:\n", "h.yaml")
    assert inv.notes == ["ignored gpus on host a (not used by bootstrap); did you mean 'bootstrap_gpus'?"]
    assert inv.nodes[0].gpus == 0


# ----- YAML 1.1 as Ansible reads it; hostile input -----------------------------------------------------


def test_values_have_ansible_yaml_1_1_meanings() -> None:
    text = (
        "all:\n  vars:\n    flags: [yes, no, on, off, Yes, OFF, y, n, 'yes']\n"
        "    numbers: [0755, 1:20, 0x1F, 1_000, 1e3, 3.10]\n  hosts:\n    a:\n"
    )
    data = plain(load_yaml(text, "y.yaml"))
    assert data["all"]["vars"]["flags"] == [True, False, True, False, True, False, "y", "n", "yes"]
    assert data["all"]["vars"]["numbers"] == [493, 80, 31, 1000, "1e3", 3.1]
    inv = load_inventory_text(
        "all:\n  hosts:\n    a:\n      bootstrap_allow_insecure: on\n      bootstrap_password_prompt: no\n"
        "      ansible_port: 0022\n",
        "y.yaml",
    )
    node = inv.nodes[0]
    assert (node.allow_insecure, node.password_prompt, node.port) == (True, False, 18)  # 0022: octal


def test_duplicate_keys_are_refused_with_their_line() -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory_text(
            "all:\n  hosts:\n    a:\n      ansible_user: x\n      ansible_user: y\n", "d.yaml"
        )
    (issue,) = info.value.issues
    assert str(issue) == "d.yaml:5: duplicate key 'ansible_user' in the same mapping"


def only_issue(text: str, source: str = "h.yaml") -> str:
    with pytest.raises(InventoryError) as info:
        load_inventory_text(text, source)
    (issue,) = info.value.issues
    assert str(issue).startswith(source) and "\n" not in str(issue)
    return str(issue)


@pytest.mark.timeout(60)  # guards against the hang this was (no timing is measured)
def test_alias_bomb_in_an_unused_variable_is_refused() -> None:
    levels = ["      l0: &l0 [" + ", ".join(["lol"] * 9) + "]\n"]
    levels += [f"      l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n" for i in range(1, 9)]
    text = "all:\n  hosts:\n    a:\n  vars:\n    not_used_by_bootstrap:\n" + "".join(levels)
    issue = only_issue(text)
    assert f"more than {MAX_ALIAS_VALUES} values" in issue and "billion laughs" in issue


@pytest.mark.timeout(60)
def test_huge_host_range_is_refused() -> None:
    issue = only_issue("all:\n  hosts:\n    n[0:99999999]:\n")
    assert issue == (
        f"h.yaml:3: host range 'n[0:99999999]' gives more than {MAX_RANGE_HOSTS} hosts: "
        "split it or list fewer hosts"
    )
    assert "more than" in only_issue("all:\n  hosts:\n    r[0:99]n[0:99]:\n")  # 10,000 in one name
    digits = only_issue("all:\n  hosts:\n    ? n[0:" + "9" * 100_000 + "]\n")  # int() would refuse it
    assert digits.startswith("h.yaml:3: bad host range") and len(digits) < 200


@pytest.mark.timeout(60)
def test_host_ranges_are_limited_in_total() -> None:
    text = "all:\n  hosts:\n" + "".join(f"    g{i}-[1:4000]:\n" for i in range(30))
    issue = only_issue(text)
    assert issue.startswith("h.yaml:4: ") and f"more than {MAX_RANGE_HOSTS} hosts" in issue
    inv = load_inventory_text("all:\n  hosts:\n    a[1:2000]:\n    b[1:2000]:\n", "ok.yaml")
    assert len(inv.nodes) == 4000


def test_a_one_megabyte_ansible_inventory_loads(tmp_path: Path) -> None:
    racks, per_rack = 290, 40
    parts = ["all:\n  vars:\n    ansible_user: trainer\n    bootstrap_backend: gloo\n  children:\n"]
    for rack in range(racks):
        parts.append(f"    rack{rack:03d}:\n      vars: {{bootstrap_gpus: {rack % 3}}}\n      hosts:\n")
        for i in range(rack * per_rack, (rack + 1) * per_rack):
            address = f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"
            parts.append(
                f"        node-{i:05d}:\n          ansible_host: {address}\n          ansible_become: yes\n"
            )
    path = tmp_path / "big.yaml"
    path.write_text("".join(parts))
    assert path.stat().st_size >= 1_000_000
    inv = load_inventory(path)
    assert len(inv.nodes) == racks * per_rack
    last = inv.nodes[-1]
    assert (last.gpus, last.tags, last.line) == (1, ("rack289",), len(path.read_text().splitlines()) - 2)


def test_an_ansible_ini_inventory_is_named_with_the_command_that_converts_it() -> None:
    """An INI inventory got "YAML syntax error: did not find expected <document start>"."""
    from orchestrator.errors import InventoryError
    from orchestrator.inventory import load_inventory_text

    for text in ("[gpu]\nws1 ansible_host=10.0.0.1\n", "# lab\n\n[all:vars]\nansible_user=root\n"):
        with pytest.raises(InventoryError) as refused:
            load_inventory_text(text, "hosts.ini")
        said = str(refused.value)
        assert "an Ansible INI inventory" in said and "ansible-inventory -i hosts.ini -y --list" in said, said

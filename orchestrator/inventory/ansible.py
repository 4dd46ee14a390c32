"""Ansible YAML inventories, read unchanged (see docs/inventory.md, "Ansible inventories").

Groups nest through ``children:``; variables come from ``vars:`` of every group a host belongs to and
from the host's own entry. Precedence, lowest first: group ``all``, then groups by depth (parents before
children; among groups at the same depth the one defined later in the file wins), then host variables
(a host listed several times: the later entry wins). ``ansible_*`` connection variables map to node
fields; product settings use the ``bootstrap_`` prefix.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.inventory._yaml import GROUP_KEYS, looks_ansible
from orchestrator.inventory._yaml_values import Tagged, describe, did_you_mean, key_line, plain
from orchestrator.inventory.ansible_hosts import HostPatterns
from orchestrator.inventory.assemble import NodeDraft, assemble
from orchestrator.inventory.cluster import Inventory
from orchestrator.inventory.issues import IssueLog, Source

__all__ = ["looks_ansible", "read_ansible"]


# bootstrap_* settings of the cluster: only in the vars of group "all".
CLUSTER_VARS: dict[str, str] = {
    "bootstrap_cluster_name": "name",
    "bootstrap_master": "master",
    "bootstrap_port": "port",
    "bootstrap_backend": "backend",
}
# bootstrap_* settings of a node: anywhere (group or host vars).
NODE_VARS: dict[str, str] = {
    "bootstrap_gpus": "gpus",
    "bootstrap_nproc": "nproc",
    "bootstrap_interface": "interface",
    "bootstrap_workdir": "workdir",
    "bootstrap_os": "os",
    "bootstrap_password_env": "password_env",
    "bootstrap_password_prompt": "password_prompt",
    "bootstrap_allow_insecure": "allow_insecure",
    "bootstrap_windows_mode": "windows.mode",
    "bootstrap_wsl_distro": "windows.distro",
    "bootstrap_wsl_user": "windows.wsl_user",
}
# ansible_* variables copied to a node field as they are (aliases included).
PLAIN_VARS: dict[str, str] = {
    "ansible_host": "host",
    "ansible_ssh_host": "host",
    "ansible_port": "port",
    "ansible_ssh_port": "port",
    "ansible_user": "user",
    "ansible_ssh_user": "user",
    "ansible_ssh_private_key_file": "key_file",
    "ansible_private_key_file": "key_file",
    "ansible_winrm_scheme": "winrm.scheme",
    "ansible_winrm_ca_trust_path": "winrm.ca_bundle",
}
PASSWORD_VARS = ("ansible_password", "ansible_ssh_pass")
# ansible_* variables that need a conversion, and the node field each one sets.
SPECIAL_VARS: dict[str, str] = {
    "ansible_connection": "connection",
    "ansible_winrm_transport": "winrm.transport",
    "ansible_winrm_server_cert_validation": "winrm.cert_validation",
    "ansible_python_interpreter": "python",
    "ansible_os_family": "os",
}
KNOWN_BOOTSTRAP = (*CLUSTER_VARS, *NODE_VARS)

_CONNECTIONS = {"ssh": "ssh", "paramiko": "ssh", "smart": "ssh", "winrm": "winrm", "local": "local"}
_TRANSPORTS = ("ntlm", "kerberos", "credssp", "basic", "certificate")
_TRANSPORT_ALIASES = {"plaintext": "basic", "ssl": "basic"}
_NON_LINUX_FAMILIES = frozenset(
    {"darwin", "freebsd", "openbsd", "netbsd", "dragonfly", "solaris", "aix", "hp-ux"}
)
_AUTO_PYTHON = frozenset({"auto", "auto_silent", "auto_legacy", "auto_legacy_silent"})
_PLAYBOOK_PYTHON = re.compile(r"^\s*\{\{\s*ansible_playbook_python\s*\}\}\s*$")
_ENV_LOOKUP = re.compile(
    r"""^\s*\{\{\s*lookup\(\s*(['"])env\1\s*,\s*(['"])(?P<name>[A-Za-z_][A-Za-z0-9_]*)\2\s*\)\s*\}\}\s*$"""
)
_NOTE_HOSTS = 8


@dataclass
class _Var:
    key: str
    value: Any
    line: int | None
    scope: str  # "vars of group 'x'" or "host 'y'"
    group: str | None  # the group whose vars define it (None: host variable)


@dataclass
class _Group:
    name: str
    order: int
    line: int | None
    hosts: dict[str, None] = field(default_factory=dict)  # an ordered set: thousands of hosts stay linear
    vars: dict[str, _Var] = field(default_factory=dict)
    parents: set[str] = field(default_factory=set)


_Put = Callable[[str, _Var, Any], None]


def _is_template(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


class _Reader:
    def __init__(self, data: Mapping[Any, Any], source: str) -> None:
        self.data = data
        self.log = IssueLog(source)
        self.groups: dict[str, _Group] = {}
        self.hosts: dict[str, int | None] = {}  # host name -> line of its first appearance (in order)
        self.host_vars: dict[str, dict[str, _Var]] = {}
        self.ignored: dict[str, list[str]] = {}  # variable -> hosts
        self.literal_password: list[str] = []
        self.playbook_python: list[str] = []
        self.notes: list[str] = []
        self._reported: set[int] = set()
        self._patterns = HostPatterns(self.log)  # host names from ``web[01:03]`` and ``:port`` keys
        self._refused_patterns = False  # some host pattern was reported and gave no host
        self._direct: dict[str, list[str]] | None = None  # see _membership

    # ----- structure -----------------------------------------------------------------------------------

    def read(self) -> Inventory:
        self._group_entry("all", None, None, parent=None)
        for name, body in self.data.items():
            self._group_entry(name, body, key_line(self.data, name), parent=None)
        if not self.hosts and not self._refused_patterns:  # else the refused pattern says why
            self.log.add(
                "the Ansible inventory has no hosts (expected 'all: {hosts: {NAME: ...}}')", field="hosts"
            )
        depth = self._depths()
        drafts = [self._draft(host, depth) for host in self.hosts]
        cluster_values, cluster_sources = self._cluster_settings()
        self._notes()
        return assemble(
            source=self.log.source,
            fmt="ansible",
            drafts=drafts,
            cluster_values=cluster_values,
            cluster_sources=cluster_sources,
            cluster_line=self.groups["all"].line,
            default_master=self._default_master(),
            notes=self.notes,
            log=self.log,
        )

    def _group_entry(self, name: Any, body: Any, line: int | None, parent: str | None) -> None:
        gname = str(name)
        group = self.groups.get(gname)
        if group is None:
            group = self.groups[gname] = _Group(gname, len(self.groups), line)
        elif group.line is None:
            group.line = line
        if parent is not None:
            group.parents.add(parent)
        if body is None:
            return
        if not isinstance(body, Mapping):
            self.log.add(
                f"group '{gname}': expected a mapping with hosts, vars or children, "
                f"got {describe(plain(body))}",
                line=line,
                field=gname,
            )
            return
        # In file order, so hosts and groups are numbered by their first appearance.
        for key in body:
            if key == "hosts":
                self._hosts(group, body)
            elif key == "vars":
                self._vars(group, body)
            elif key == "children":
                self._children(group, body)
            else:
                self.log.add(
                    f"group '{gname}': unknown key '{key}'{did_you_mean(str(key), GROUP_KEYS)} "
                    "(expected hosts, vars or children)",
                    line=key_line(body, key),
                    field=str(key),
                )

    def _children(self, group: _Group, body: Mapping[Any, Any]) -> None:
        children = body.get("children")
        if children is None:
            return
        if not isinstance(children, Mapping):
            self.log.add(
                f"group '{group.name}': expected a mapping of child groups, got {describe(plain(children))}",
                line=key_line(body, "children"),
                field="children",
            )
            return
        for child, child_body in children.items():
            self._group_entry(child, child_body, key_line(children, child), parent=group.name)

    def _hosts(self, group: _Group, body: Mapping[Any, Any]) -> None:
        hosts = body.get("hosts")
        if hosts is None:
            return
        if not isinstance(hosts, Mapping):
            hint = " (write 'web1:' with a colon, not '- web1')" if isinstance(hosts, list) else ""
            self.log.add(
                f"group '{group.name}': expected a mapping of host names, got {describe(plain(hosts))}{hint}",
                line=key_line(body, "hosts"),
                field="hosts",
            )
            return
        for pattern, host_body in hosts.items():
            line = key_line(hosts, pattern)
            names = self._patterns.expand(str(pattern), line)
            if not names:
                self._refused_patterns = True
            for name, port in names:
                if name not in self.hosts:
                    self.hosts[name] = line
                    self.host_vars[name] = {}
                group.hosts.setdefault(name)
                scope = f"host '{name}'"
                if port is not None:
                    self.host_vars[name]["ansible_port"] = _Var("ansible_port", port, line, scope, None)
                if host_body is None:
                    continue
                if not isinstance(host_body, Mapping):
                    self.log.add(
                        f"expected a mapping of host variables, got {describe(plain(host_body))}",
                        line=line,
                        node=name,
                    )
                    continue
                for key, value in host_body.items():
                    var = _Var(str(key), plain(value), key_line(host_body, key), scope, None)
                    self.host_vars[name][str(key)] = var

    def _vars(self, group: _Group, body: Mapping[Any, Any]) -> None:
        variables = body.get("vars")
        if variables is None:
            return
        if not isinstance(variables, Mapping):
            self.log.add(
                f"group '{group.name}': expected a mapping of variables, got {describe(plain(variables))}",
                line=key_line(body, "vars"),
                field="vars",
            )
            return
        for key, value in variables.items():
            scope = f"vars of group '{group.name}'"
            group.vars[str(key)] = _Var(str(key), plain(value), key_line(variables, key), scope, group.name)

    def _depths(self) -> dict[str, int]:
        depth: dict[str, int] = {"all": 0}
        visiting: set[str] = set()

        def of(name: str) -> int:
            if name in depth:
                return depth[name]
            if name in visiting:
                group = self.groups[name]
                self.log.add(f"group '{name}' is its own descendant (children loop)", line=group.line)
                return 0
            visiting.add(name)
            parents = self.groups[name].parents - {"all"}
            value = 1 + max((of(p) for p in parents), default=0)
            visiting.discard(name)
            depth[name] = value
            return value

        for name in self.groups:
            of(name)
        return depth

    def _membership(self, host: str) -> list[str]:
        """Every group holding ``host``, directly or through children (ancestors included)."""
        if self._direct is None:  # host -> the groups listing it, in group order (built once: linear)
            self._direct = {}
            for group in self.groups.values():
                for member in group.hosts:
                    self._direct.setdefault(member, []).append(group.name)
        found: list[str] = []
        stack = list(self._direct.get(host, ()))
        while stack:
            name = stack.pop()
            if name in found:
                continue
            found.append(name)
            stack.extend(self.groups[name].parents)
        if "all" not in found:
            found.append("all")
        return found

    # ----- variables -> node fields -------------------------------------------------------------------

    def _issue(self, var: _Var, message: str, node: str) -> None:
        """Report a problem with a variable once, however many hosts share it."""
        if id(var) in self._reported:
            return
        self._reported.add(id(var))
        if var.group is None:
            self.log.add(message, line=var.line, node=node, field=var.key)
        else:
            self.log.add(f"{message} (set in {var.scope})", line=var.line, field=var.key)

    def _usable(self, var: _Var, node: str) -> bool:
        """False (with an issue) for values we cannot use: vault-encrypted, tagged or templated."""
        if isinstance(var.value, Tagged):
            if var.value.tag == "!vault":
                self._issue(var, "vault-encrypted values are not supported; use bootstrap_password_env", node)
            else:
                self._issue(var, f"values tagged {var.value.tag} are not supported", node)
            return False
        if _is_template(var.value):
            self._issue(var, "Jinja templating is not evaluated by bootstrap: write the plain value", node)
            return False
        return True

    def _draft(self, host: str, depth: dict[str, int]) -> NodeDraft:
        groups = self._membership(host)
        ordered = sorted(groups, key=lambda g: (depth.get(g, 0), self.groups[g].order))
        effective: dict[str, _Var] = {}
        for group in ordered:
            effective.update(self.groups[group].vars)
        effective.update(self.host_vars[host])

        draft = NodeDraft(label=host, line=self.hosts[host], values={"name": host, "host": host})
        draft.sources["name"] = Source(self.hosts[host], "hosts")
        draft.sources["host"] = Source(self.hosts[host], "hosts")
        tags = [g for g in groups if g != "all"]
        tags.sort(key=lambda g: self.groups[g].order)
        draft.values["tags"] = tags
        winrm: dict[str, Any] = {}
        windows: dict[str, Any] = {}
        os_from: str | None = None  # which variable decided the os

        def put(target: str, var: _Var, value: Any) -> None:
            source = Source(var.line, var.key, var.scope if var.group is not None else None)
            if target.startswith("winrm."):
                winrm[target.split(".", 1)[1]] = value
            elif target.startswith("windows."):
                windows[target.split(".", 1)[1]] = value
            else:
                draft.values[target] = value
            draft.sources[target] = source

        for key, var in effective.items():
            if key in CLUSTER_VARS:
                continue
            if key.startswith("bootstrap_") and key not in NODE_VARS:
                suggestion = did_you_mean(key, KNOWN_BOOTSTRAP)
                self._issue(var, f"unknown bootstrap setting '{key}'{suggestion}", host)
                continue
            if key in NODE_VARS:
                if self._usable(var, host):
                    put(NODE_VARS[key], var, var.value)
                else:
                    draft.errored.add(NODE_VARS[key])
                if key == "bootstrap_os":
                    os_from = key
                continue
            if key in PLAIN_VARS:
                if self._usable(var, host):
                    put(PLAIN_VARS[key], var, var.value)
                else:
                    draft.errored.add(PLAIN_VARS[key])
                continue
            if key in PASSWORD_VARS:
                self._password(var, host, draft, put)
                continue
            if key in SPECIAL_VARS:
                if key == "ansible_python_interpreter" and isinstance(var.value, str):
                    if var.value in _AUTO_PYTHON:
                        continue
                    if _PLAYBOOK_PYTHON.match(var.value):
                        self.playbook_python.append(host)
                        continue
                if not self._usable(var, host):
                    draft.errored.add(SPECIAL_VARS[key])
                    continue
                self._special(key, var, host, draft, put)
                continue
            self.ignored.setdefault(key, []).append(host)

        if winrm:
            draft.values["winrm"] = winrm
        if windows:
            draft.values["windows"] = windows
        if draft.values.get("connection") == "local" and draft.sources["host"].key == "hosts":
            # Like Ansible: a local host runs here, whatever its name (unless ansible_host says otherwise).
            draft.values["host"] = "localhost"
        if os_from is None:
            family = effective.get("ansible_os_family")
            if family is not None and isinstance(family.value, str) and family.value.lower() == "windows":
                put("os", family, "windows")
            elif draft.values.get("connection") == "winrm":
                put("os", effective["ansible_connection"], "windows")
        return draft

    def _password(self, var: _Var, host: str, draft: NodeDraft, put: _Put) -> None:
        value = var.value
        if isinstance(value, Tagged):
            self._usable(var, host)
            return
        if isinstance(value, str):
            lookup = _ENV_LOOKUP.match(value)
            if lookup:
                if "password_env" not in draft.values:
                    put("password_env", var, lookup.group("name"))
                return
            if _is_template(value):
                self._issue(
                    var,
                    "Jinja templating is not evaluated by bootstrap: use \"{{ lookup('env', 'NAME') }}\" "
                    "or bootstrap_password_env",
                    host,
                )
                return
        if value is None:
            return
        if isinstance(value, (Mapping, list)):
            self._issue(var, "expected a password string; the value is not shown", host)
            return
        draft.password = str(value)
        self.literal_password.append(host)

    def _special(self, key: str, var: _Var, host: str, draft: NodeDraft, put: _Put) -> None:
        value = var.value
        if key == "ansible_connection":
            name = value.lower() if isinstance(value, str) else None
            if name not in _CONNECTIONS:
                allowed = ", ".join(_CONNECTIONS)
                self._issue(var, f"unsupported connection {describe(value)}: expected one of {allowed}", host)
                draft.errored.add("connection")
                return
            put("connection", var, _CONNECTIONS[name])
        elif key == "ansible_winrm_transport":
            items = value if isinstance(value, list) else str(value).split(",")
            wanted = [str(i).strip().lower() for i in items]
            supported = [_TRANSPORT_ALIASES.get(w, w) for w in wanted]
            chosen = next((t for t in supported if t in _TRANSPORTS), None)
            if chosen is None:
                allowed = ", ".join(_TRANSPORTS)
                message = f"no supported WinRM transport in {describe(value)}: expected one of {allowed}"
                self._issue(var, message, host)
                draft.errored.add("winrm.transport")
                return
            put("winrm.transport", var, chosen)
        elif key == "ansible_winrm_server_cert_validation":
            text = str(value).lower() if isinstance(value, str) else None
            if text not in ("validate", "ignore"):
                self._issue(var, f"expected 'validate' or 'ignore', got {describe(value)}", host)
                draft.errored.add("winrm.cert_validation")
                return
            put("winrm.cert_validation", var, text == "validate")
        elif key == "ansible_python_interpreter":
            put("python", var, value)
        elif key == "ansible_os_family":
            family = str(value).lower() if isinstance(value, str) else ""
            if family in _NON_LINUX_FAMILIES or not isinstance(value, str):
                self._issue(var, f"only Linux and Windows nodes are supported, got {describe(value)}", host)
                draft.errored.add("os")

    # ----- cluster, master, notes ---------------------------------------------------------------------

    def _cluster_settings(self) -> tuple[dict[str, Any], dict[str, Source]]:
        values: dict[str, Any] = {}
        sources: dict[str, Source] = {}
        for group in self.groups.values():
            for key, var in group.vars.items():
                if key in CLUSTER_VARS and group.name != "all":
                    self._issue(var, f"{key} is a cluster setting: set it in the vars of group 'all'", "")
        for host, variables in self.host_vars.items():
            for key, var in variables.items():
                if key in CLUSTER_VARS:
                    self._issue(var, f"{key} is a cluster setting: set it in the vars of group 'all'", host)
        for key, var in self.groups["all"].vars.items():
            if key in CLUSTER_VARS and self._usable(var, ""):
                values[CLUSTER_VARS[key]] = var.value
                sources[CLUSTER_VARS[key]] = Source(var.line, key)
        return values, sources

    def _default_master(self) -> str | None:
        for name in ("master", "masters"):
            group = self.groups.get(name)
            if group is not None:
                members = [h for h in self.hosts if name in self._membership(h)]
                if members:
                    return members[0]
        return next(iter(self.hosts), None)

    def _notes(self) -> None:
        if self.literal_password:
            self.notes.append(
                f"ansible_password is a literal value on {_hosts_text(self.literal_password)}: it is kept in "
                "memory only and never shown; prefer bootstrap_password_env (or "
                "\"{{ lookup('env', 'NAME') }}\")"
            )
        if self.playbook_python:
            self.notes.append(
                "ansible_python_interpreter '{{ ansible_playbook_python }}' on "
                f"{_hosts_text(self.playbook_python)}: using the platform's default interpreter"
            )
        for key, hosts in self.ignored.items():
            ours = f"bootstrap_{key}"
            hint = f"; did you mean '{ours}'?" if ours in NODE_VARS or ours in CLUSTER_VARS else ""
            self.notes.append(f"ignored {key} on {_hosts_text(hosts)} (not used by bootstrap){hint}")


def _hosts_text(hosts: list[str]) -> str:
    unique = list(dict.fromkeys(hosts))
    shown = ", ".join(unique[:_NOTE_HOSTS])
    if len(unique) > _NOTE_HOSTS:
        shown += f" and {len(unique) - _NOTE_HOSTS} more"
    return f"host {shown}" if len(unique) == 1 else f"hosts {shown}"


def read_ansible(data: Mapping[Any, Any], source: str) -> Inventory:
    """Build an :class:`Inventory` from a parsed Ansible YAML inventory."""
    return _Reader(data, source).read()

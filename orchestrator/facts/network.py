"""Facts the preflight needs: routes, addresses, interfaces, name resolution, free disk."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from orchestrator.facts.base import Fact, FactParseError
from orchestrator.facts.linux import NODENAME
from orchestrator.platforms import Platform


@dataclass(frozen=True)
class Route:
    """How this node reaches the master: resolved address, interface, source address.

    Linux: ``ip -4 route get`` (interface = the route's dev). Native Windows:
    ``Find-NetRoute`` (interface = the adapter's InterfaceAlias, see facts/windows.py)."""

    target: str  # the master's host as written in the inventory
    address: str | None  # what it resolved to here (None: resolution failed)
    interface: str | None  # "dev" of the route; "lo" when the address is this node's own
    source: str | None  # "src" of the route: the address peers will see
    local: bool  # the master address is one of this node's addresses

    @property
    def detail(self) -> str | None:
        """Why resolution or the route failed, when the node said (see WindowsRoute)."""
        return None


def parse_route_line(line: str) -> tuple[str | None, str | None, bool]:
    """``ip -4 -o route get`` output -> (dev, src, local)."""
    words = line.replace("\\", " ").split()
    dev = words[words.index("dev") + 1] if "dev" in words else None
    src = words[words.index("src") + 1] if "src" in words else None
    return dev, src, bool(words) and words[0] == "local"


class MasterRoute(Fact[Route]):
    """``ip -4 route get <master>``: the interface and source address gloo/NCCL must use."""

    name = "route"

    def __init__(self, master_host: str) -> None:
        self.master_host = master_host

    def command(self, platform: Platform) -> str:
        host = platform.quote(self.master_host)
        try:  # an IPv4 address resolves to itself: no getent
            return f"echo resolved {ipaddress.IPv4Address(self.master_host)}\nip -4 -o route get {host}"
        except ValueError:
            pass
        # getent follows /etc/hosts and DNS like the training processes will; its first IPv4 wins
        return (
            f"set -- $(getent ahostsv4 {host})\n"
            'echo "resolved ${1:-}"\n'
            '[ -n "${1:-}" ] && ip -4 -o route get "$1"'
        )

    def parse(self, output: str, exit_code: int) -> Route:
        lines = output.splitlines()
        if not lines or not lines[0].startswith("resolved"):
            raise FactParseError("no resolution line")
        address = lines[0].partition(" ")[2].strip() or None
        if address is None or len(lines) < 2:
            return Route(self.master_host, address, None, None, False)
        dev, src, local = parse_route_line(lines[1])
        return Route(self.master_host, address, dev, src, local)


@dataclass(frozen=True)
class InterfaceAddress:
    interface: str
    address: str
    prefix: int


class Addresses(Fact["tuple[InterfaceAddress, ...]"]):
    """Every IPv4 address and the interface holding it (``ip -4 -o addr show``)."""

    name = "addresses"

    def command(self, platform: Platform) -> str:
        return "ip -4 -o addr show"

    def parse(self, output: str, exit_code: int) -> tuple[InterfaceAddress, ...]:
        if exit_code != 0:
            raise FactParseError("ip -4 addr failed (is iproute2 installed?)")
        found = []
        for line in output.splitlines():
            words = line.split()
            if "inet" not in words:
                continue
            interface = words[1]
            address, _, prefix = words[words.index("inet") + 1].partition("/")
            found.append(InterfaceAddress(interface, address, int(prefix or 32)))
        return tuple(found)


class Interfaces(Fact["tuple[str, ...]"]):
    """Names of every network interface (``ip -o link show``), to check an ``interface:`` override."""

    name = "interfaces"

    def command(self, platform: Platform) -> str:
        return "ip -o link show"

    def parse(self, output: str, exit_code: int) -> tuple[str, ...]:
        if exit_code != 0:
            raise FactParseError("ip link failed (is iproute2 installed?)")
        names = []
        for line in output.splitlines():
            parts = line.split(":", 2)
            if len(parts) >= 2:
                names.append(parts[1].strip().partition("@")[0])  # veth0@if12 -> veth0
        return tuple(names)


class HostnameAddress(Fact["str | None"]):
    """What this node's own hostname resolves to: gloo binds that address when no interface is set,
    and Debian/Ubuntu map the hostname to 127.0.1.1 (FIELD_NOTES: the loopback trap)."""

    name = "hostname_address"

    def command(self, platform: Platform) -> str:
        return f'{NODENAME} || h=$(hostname)\nset -- $(getent ahostsv4 "$h")\necho "${{1:-}}"'

    def parse(self, output: str, exit_code: int) -> str | None:
        return output.strip() or None


@dataclass(frozen=True)
class DiskSpace:
    path: str  # the directory measured: the workdir or its nearest existing parent
    free_bytes: int


class DiskFree(Fact[DiskSpace]):
    """Free space where the node's workdir is (or will be)."""

    name = "disk"

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir

    def command(self, platform: Platform) -> str:
        start = platform.path_word(self.workdir)
        return f'd={start}\nwhile [ ! -d "$d" ]; do d=$(dirname "$d"); done\necho "$d"\ndf -Pk "$d"'

    def parse(self, output: str, exit_code: int) -> DiskSpace:
        lines = output.strip().splitlines()
        if exit_code != 0 or len(lines) < 3:
            raise FactParseError("df failed")
        words = lines[-1].split()
        return DiskSpace(path=lines[0], free_bytes=int(words[3]) * 1024)

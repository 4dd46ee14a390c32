"""Network facts of a native Windows node: the route to the master (resolution, then
``Find-NetRoute``) and the adapters with their addresses (``Get-NetAdapter``, ``Get-NetIPAddress``),
from which the preflight chooses GLOO_SOCKET_IFNAME (orchestrator/steps/preflight).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.facts.base import Fact, FactParseError
from orchestrator.facts.network import InterfaceAddress, Route
from orchestrator.facts.windows_base import key_values, powershell_of
from orchestrator.platforms import Platform

# -- network: the route to the master, the adapters (native mode) ----------------------------------
#
# GLOO_SOCKET_IFNAME on Windows is the adapter's *friendly name* (what Get-NetAdapter shows as Name
# and Find-NetRoute / Get-NetIPAddress as InterfaceAlias: "Ethernet 2", "WLAN"), compared exactly, case
# included. Read in the sources: torch/csrc/distributed/c10d/GlooDeviceFactory.cpp registers
# makeUVDevice for WIN32, which sets gloo's uv ``attr.iface`` to the variable's value;
# gloo/transport/uv/device.cc ``lookupAddrForIface`` strcmp()s it with the names
# ``uv_interface_addresses`` returns and takes that adapter's *first* unicast address of any family
# (``attr.ai_family`` is AF_UNSPEC: it can be IPv6); libuv src/win/util.c ``uv_interface_addresses``
# names each entry after ``IP_ADAPTER_ADDRESSES.FriendlyName`` (UTF-16 converted to UTF-8) and skips
# adapters whose OperStatus is not IfOperStatusUp. So not the description ("Intel(R) Ethernet
# Controller I225-V") nor the GUID (AdapterName), and an adapter that is not up is not found at all
# ("Unable to find address for: <name>").

#: adapter Status values (Get-NetAdapter's Status property, computed from its numeric states in
#: Windows' NetAdapter type data, not localized) that libuv lists: only "Up"
ADAPTER_UP = "Up"
#: Get-NetIPAddress AddressState values of an address the adapter really holds
USABLE_ADDRESS_STATES = ("Preferred", "Deprecated")


@dataclass(frozen=True)
class WindowsAdapter:
    """A network adapter as ``Get-NetAdapter`` shows it."""

    name: str  # friendly name = InterfaceAlias: what GLOO_SOCKET_IFNAME must say
    index: int  # ifIndex
    status: str  # Up, Disconnected, Disabled, Not Present
    description: str = ""  # InterfaceDescription: the driver's name, not what gloo matches

    @property
    def up(self) -> bool:
        return self.status == ADAPTER_UP


@dataclass(frozen=True)
class WindowsNetwork:
    """Adapters and the addresses on every interface (also those Get-NetAdapter hides: loopback)."""

    adapters: tuple[WindowsAdapter, ...]
    addresses: tuple[InterfaceAddress, ...]  # usable IPv4 addresses, interface = InterfaceAlias
    ipv6: tuple[InterfaceAddress, ...] = ()  # IPv6 ones: gloo binds one if it comes first

    @property
    def interfaces(self) -> tuple[str, ...]:
        """Every interface name an inventory's ``interface:`` may give."""
        names = [a.name for a in self.adapters]
        names += [a.interface for a in (*self.addresses, *self.ipv6) if a.interface not in names]
        return tuple(dict.fromkeys(names))

    @property
    def down(self) -> tuple[str, ...]:
        """Adapters gloo cannot use: not up (libuv does not list them)."""
        return tuple(a.name for a in self.adapters if not a.up)

    def adapter(self, name: str) -> WindowsAdapter | None:
        return next((a for a in self.adapters if a.name == name), None)


@dataclass(frozen=True)
class WindowsRoute(Route):
    """A :class:`~orchestrator.facts.network.Route` that can also say why it is missing: PowerShell
    gives the exception's message (resolution, Find-NetRoute)."""

    why: str | None = None

    @property
    def detail(self) -> str | None:
        return self.why


class WindowsMasterRoute(Fact[Route]):
    """The route to the master on a native Windows node: the master's name resolved like the training
    processes will (``[System.Net.Dns]::GetHostAddresses``: hosts file, then DNS; first IPv4), then
    ``Find-NetRoute -RemoteIPAddress``, which gives the interface (InterfaceAlias, InterfaceIndex)
    and the source address Windows picks, as ``ip route get`` does on Linux."""

    name = "route"

    def __init__(self, master_host: str) -> None:
        self.master_host = master_host

    def command(self, platform: Platform) -> str:
        target = powershell_of(platform).quote(self.master_host)
        return (
            f"$cbTarget = {target}\n"
            "$cbAddress = ''\n"
            "try {\n"
            "  $cbFirst = [System.Net.Dns]::GetHostAddresses($cbTarget) |\n"
            "    Where-Object { $_.AddressFamily -eq [System.Net.Sockets.AddressFamily]::InterNetwork } |\n"
            "    Select-Object -First 1\n"
            "  if ($cbFirst) { $cbAddress = $cbFirst.IPAddressToString }\n"
            "} catch {\n"
            "  'resolve_error=' + $_.Exception.Message\n"
            "}\n"
            "'resolved=' + $cbAddress\n"
            "if (-not $cbAddress) { return }\n"
            "$cbMine = @(Get-NetIPAddress -AddressFamily IPv4 -IPAddress $cbAddress"
            " -ErrorAction SilentlyContinue)\n"
            "'local=' + ($cbMine.Count -gt 0)\n"
            "try {\n"
            "  $cbFound = @(Find-NetRoute -RemoteIPAddress $cbAddress)\n"
            "} catch {\n"
            "  'route_error=' + $_.Exception.Message\n"
            "  return\n"
            "}\n"
            # Find-NetRoute returns the source address (MSFT_NetIPAddress) and the route (MSFT_NetRoute)
            "$cbSource = $cbFound | Where-Object { $_.CimClass.CimClassName -eq 'MSFT_NetIPAddress' } |"
            " Select-Object -First 1\n"
            "$cbRoute = $cbFound | Where-Object { $_.CimClass.CimClassName -eq 'MSFT_NetRoute' } |"
            " Select-Object -First 1\n"
            "if ($cbSource) {\n"
            "  'source=' + $cbSource.IPAddress\n"
            "  'index=' + $cbSource.InterfaceIndex\n"
            "  'interface=' + $cbSource.InterfaceAlias\n"
            "}\n"
            "if ($cbRoute) {\n"
            "  'prefix=' + $cbRoute.DestinationPrefix\n"
            "  'nexthop=' + $cbRoute.NextHop\n"
            "  'route_interface=' + $cbRoute.InterfaceAlias\n"
            "}"
        )

    def parse(self, output: str, exit_code: int) -> Route:
        values = key_values(output)
        if "resolved" not in values:
            raise FactParseError(f"no resolution line (exit code {exit_code})")
        address = values["resolved"] or None
        if address is None:
            why = values.get("resolve_error") or "no IPv4 address"
            return WindowsRoute(self.master_host, None, None, None, False, why=why)
        local = values.get("local", "").lower() == "true"
        interface = values.get("interface") or values.get("route_interface") or None
        source = values.get("source") or None
        detail: str | None = values.get("route_error")
        if detail is None and (interface is None or source is None):
            detail = "Find-NetRoute named no interface and source address"
        return WindowsRoute(self.master_host, address, interface, source, local, why=detail)


class WindowsAdapters(Fact[WindowsNetwork]):
    """``Get-NetAdapter`` (name, index, status, description) and ``Get-NetIPAddress`` (every address,
    loopback included), one ``key=fields`` line each; the name comes last since it may hold anything
    but a line break."""

    name = "adapters"

    def command(self, platform: Platform) -> str:
        return (
            "Get-NetAdapter | Sort-Object -Property ifIndex | ForEach-Object {\n"
            "  'adapter=' + $_.ifIndex + '|' + $_.Status + '|' + $_.Name\n"
            "  'description=' + $_.ifIndex + '|' + $_.InterfaceDescription\n"
            "}\n"
            "Get-NetIPAddress | Sort-Object -Property InterfaceIndex | ForEach-Object {\n"
            "  'address=' + $_.AddressFamily + '|' + $_.IPAddress + '|' + $_.PrefixLength + '|' +"
            " $_.AddressState + '|' + $_.InterfaceAlias\n"
            "}"
        )

    def parse(self, output: str, exit_code: int) -> WindowsNetwork:
        if exit_code != 0:
            raise FactParseError(f"Get-NetAdapter / Get-NetIPAddress failed (exit code {exit_code})")
        adapters: dict[int, WindowsAdapter] = {}
        descriptions: dict[int, str] = {}
        ipv4: list[InterfaceAddress] = []
        ipv6: list[InterfaceAddress] = []
        for line in output.replace("\r", "").split("\n"):
            key, sep, rest = line.partition("=")
            if not sep:
                continue
            if key == "adapter":
                index, status, name = rest.split("|", 2)
                adapters[int(index)] = WindowsAdapter(name=name, index=int(index), status=status)
            elif key == "description":
                index, description = rest.split("|", 1)
                descriptions[int(index)] = description
            elif key == "address":
                family, address, prefix, state, alias = rest.split("|", 4)
                if state not in USABLE_ADDRESS_STATES:
                    continue  # Tentative, Duplicate, Invalid: not an address peers can reach
                found = InterfaceAddress(alias, address, int(prefix or 0))
                (ipv6 if family == "IPv6" else ipv4).append(found)
        return WindowsNetwork(
            adapters=tuple(
                WindowsAdapter(a.name, a.index, a.status, descriptions.get(a.index, ""))
                for a in adapters.values()
            ),
            addresses=tuple(ipv4),
            ipv6=tuple(ipv6),
        )


def windows_network_facts(master_host: str) -> list[Fact[Any]]:
    """What the preflight needs from a native Windows node to choose GLOO_SOCKET_IFNAME."""
    return [WindowsMasterRoute(master_host), WindowsAdapters()]

"""Shell dialects: quoting, environment, working directory, privilege, paths."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.platforms.base import UNSAFE_DIR_EXIT, Platform, check_env_name
from orchestrator.platforms.posix import PosixShell
from orchestrator.platforms.powershell import PowerShell
from orchestrator.platforms.wsl import WslShell

if TYPE_CHECKING:
    from orchestrator.inventory.model import Node

__all__ = [
    "UNSAFE_DIR_EXIT",
    "Platform",
    "PosixShell",
    "PowerShell",
    "WslShell",
    "check_env_name",
    "platform_for",
    "platform_for_node",
    "posix_for_node",
    "windows_host_shell",
]


def platform_for(os_name: str) -> Platform:
    """The platform a node of ``os_name`` speaks natively (Windows: PowerShell)."""
    if os_name == "linux":
        return PosixShell()
    if os_name == "windows":
        return PowerShell()
    raise NotImplementedError(f"no shell platform for os {os_name!r}")


def platform_for_node(node: Node) -> Platform:
    """The platform commands for ``node`` are written in: Linux nodes POSIX sh; Windows nodes
    PowerShell in ``native`` mode, and sh inside their WSL distribution in ``wsl`` mode."""
    if node.os == "windows" and node.windows.mode == "wsl":
        return WslShell(node.windows.distro, node.windows.wsl_user)
    return platform_for(node.os)


def posix_for_node(node: Node) -> PosixShell:
    """The POSIX shell of a Linux node (what chrony, nftables and the other Linux-only steps write
    in); any other node is a bug of the caller's."""
    platform = platform_for_node(node).as_posix()
    if platform is None or node.os != "linux":
        raise TypeError(f"{node.name} is not a Linux node")
    return platform


def windows_host_shell(node: Node) -> PowerShell:
    """The PowerShell of a Windows node's machine (the node's own shell, or the host of its WSL
    distribution: firewall rules and the time service belong to Windows); any other node is a bug of
    the caller's."""
    shell = platform_for_node(node).host_shell.as_powershell()
    if shell is None or node.os != "windows":
        raise TypeError(f"{node.name} is not a Windows node")
    return shell

"""Shell dialects: quoting, environment, working directory, privilege, paths."""

from __future__ import annotations

from orchestrator.platforms.base import Platform, check_env_name
from orchestrator.platforms.posix import PosixShell

__all__ = ["Platform", "PosixShell", "check_env_name", "platform_for"]


def platform_for(os_name: str) -> Platform:
    """The platform a node of ``os_name`` speaks (PowerShell arrives with the WinRM transport)."""
    if os_name == "linux":
        return PosixShell()
    raise NotImplementedError(f"no shell platform for os {os_name!r} yet")

"""Facts of Linux nodes (and of WSL distributions, later)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

from orchestrator.facts.base import Fact, FactParseError
from orchestrator.platforms import Platform

#: exit code of sh when a command is not found
NOT_FOUND = 127

#: the kernel's host name (what `hostname` and `uname -n` print) into ``$h`` without a process: the
#: `read` builtin (a read script asks every node; a process less is CPU every node saves)
NODENAME = "{ IFS= read -r h </proc/sys/kernel/hostname; } 2>/dev/null"


def print_file(path: str) -> str:
    """Shell text printing the text file ``path`` (a shell word) line by line with builtins (``cat``
    is a process on every node; a last line without its newline gets one); fails (status 2) when it
    cannot be read."""
    return f'while IFS= read -r l || [ -n "$l" ]; do printf \'%s\\n\' "$l"; done <{path}'


def _public(obj: Any) -> Any:
    return asdict(obj) if obj is not None else None


@dataclass(frozen=True)
class OsInfo:
    id: str
    version_id: str
    pretty_name: str


class OsRelease(Fact[OsInfo]):
    name = "os"

    def command(self, platform: Platform) -> str:
        return f"{{ {print_file('/etc/os-release')}; }} 2>/dev/null || {print_file('/usr/lib/os-release')}"

    def parse(self, output: str, exit_code: int) -> OsInfo:
        if exit_code != 0:
            raise FactParseError("no /etc/os-release")
        values: dict[str, str] = {}
        for line in output.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip():
                values[key.strip()] = value.strip().strip("\"'")
        return OsInfo(
            id=values.get("ID", "linux"),
            version_id=values.get("VERSION_ID", ""),
            pretty_name=values.get("PRETTY_NAME", values.get("NAME", "Linux")),
        )


@dataclass(frozen=True)
class KernelInfo:
    system: str
    release: str
    machine: str


class Kernel(Fact[KernelInfo]):
    name = "kernel"

    def command(self, platform: Platform) -> str:
        return "uname -s -r -m"  # one line: a release never holds a space

    def parse(self, output: str, exit_code: int) -> KernelInfo:
        words = output.split()  # "Linux 6.1.0 x86_64", or one per line (as recorded before)
        if len(words) < 3:
            raise FactParseError(f"unexpected uname output {output.strip()!r}")
        system, release, machine = words[:3]
        return KernelInfo(system=system, release=release, machine=machine)


class Hostname(Fact[str]):
    name = "hostname"

    def command(self, platform: Platform) -> str:
        return NODENAME + ' && echo "$h" || hostname 2>/dev/null || uname -n'

    def parse(self, output: str, exit_code: int) -> str:
        value = output.strip()
        if exit_code != 0 or not value:
            raise FactParseError("no hostname printed")
        return value


class CpuCount(Fact[int]):
    name = "cpus"

    def command(self, platform: Platform) -> str:
        # online CPUs usable by this process (cgroup/affinity limits included), like os.cpu_count()
        return "nproc 2>/dev/null || getconf _NPROCESSORS_ONLN"

    def parse(self, output: str, exit_code: int) -> int:
        return int(output.strip())


@dataclass(frozen=True)
class MemoryInfo:
    total_bytes: int
    available_bytes: int


class Memory(Fact[MemoryInfo]):
    name = "memory"

    def command(self, platform: Platform) -> str:
        return print_file("/proc/meminfo")

    def parse(self, output: str, exit_code: int) -> MemoryInfo:
        kib: dict[str, int] = {}
        for line in output.splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                kib[key.strip()] = int(parts[0])
        total = kib["MemTotal"]
        return MemoryInfo(total_bytes=total * 1024, available_bytes=kib.get("MemAvailable", 0) * 1024)


@dataclass(frozen=True)
class PythonInfo:
    path: str
    version: str


#: the section one interpreter start answers the Python and torch facts in
INTERPRETER_SECTION = "python_torch"
_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")


def interpreter_probe(platform: Platform, interpreter: str) -> str:
    """The command answering the Python and torch facts in one interpreter start: the torch probe,
    whose first two lines are ``sys.executable`` and the version, printed before anything that
    could fail (``-S``: they do not depend on site-packages; the probe adds them afterwards)."""
    probe = resources.files("orchestrator.facts.probes").joinpath("torch_facts.py").read_text()
    # path_word: a venv under ~ (cluster.env's default) must expand on the node
    return platform.path_word(interpreter) + " " + platform.join(["-S", "-c", probe])


class Python(Fact["PythonInfo | None"]):
    """The interpreter training will use on this node; ``None`` when it is not there."""

    name = "python"
    shared_section = INTERPRETER_SECTION

    def __init__(self, interpreter: str) -> None:
        self.interpreter = interpreter

    def command(self, platform: Platform) -> str:
        return interpreter_probe(platform, self.interpreter)

    def parse(self, output: str, exit_code: int) -> PythonInfo | None:
        if exit_code == NOT_FOUND:
            return None
        # the first two lines, whatever the torch probe after them did (its exit code is its own)
        lines = output.strip().splitlines()[:2]
        if len(lines) < 2 or not _VERSION.fullmatch(lines[1].strip()):
            raise FactParseError(f"{self.interpreter} failed")
        return PythonInfo(path=lines[0].strip(), version=lines[1].strip())


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_mib: int | None
    driver: str
    uuid: str


@dataclass(frozen=True)
class GpuReport:
    gpus: tuple[GpuInfo, ...]
    nvidia_smi: bool  # nvidia-smi exists on the node
    error: str | None = None  # nvidia-smi exists but failed (driver not loaded, ...)


class Gpus(Fact[GpuReport]):
    name = "gpus"

    FIELDS = "index,name,memory.total,driver_version,uuid"

    def command(self, platform: Platform) -> str:
        query = platform.join(["nvidia-smi", f"--query-gpu={self.FIELDS}", "--format=csv,noheader,nounits"])
        # nvidia-smi writes its failures on stdout; keep them for the error text
        return f"command -v nvidia-smi >/dev/null || exit {NOT_FOUND}\n{query} 2>&1"

    def parse(self, output: str, exit_code: int) -> GpuReport:
        if exit_code == NOT_FOUND:
            return GpuReport(gpus=(), nvidia_smi=False)
        if exit_code != 0:
            first = output.strip().splitlines()[0] if output.strip() else f"exit code {exit_code}"
            return GpuReport(gpus=(), nvidia_smi=True, error=first)
        gpus = []
        for line in output.strip().splitlines():
            cells = [c.strip() for c in line.split(",")]
            if len(cells) != 5:
                raise FactParseError(f"unexpected nvidia-smi line {line!r}")
            index, name, memory, driver, uuid = cells
            gpus.append(
                GpuInfo(
                    index=int(index),
                    name=name,
                    memory_mib=int(memory) if memory.isdigit() else None,
                    driver=driver,
                    uuid=uuid,
                )
            )
        return GpuReport(gpus=tuple(gpus), nvidia_smi=True)


@dataclass(frozen=True)
class TorchInfo:
    installed: bool
    version: str | None = None
    cuda_build: str | None = None
    cuda_available: bool = False
    cuda_devices: int = 0
    distributed: bool = False
    gloo: bool = False
    nccl: bool = False
    nccl_version: str | None = None
    gloo_works: bool = False  # a real one-rank gloo process group initialised and reduced
    gloo_error: str | None = None
    error: str | None = None


class Torch(Fact["TorchInfo | None"]):
    """torch in the node's interpreter: version, CUDA build, and which c10d backends it has.

    ``None`` when the interpreter itself is missing (the Python fact says so).
    """

    name = "torch"

    def __init__(self, interpreter: str) -> None:
        self.interpreter = interpreter

    shared_section = INTERPRETER_SECTION  # one interpreter start: see Python

    def command(self, platform: Platform) -> str:
        return interpreter_probe(platform, self.interpreter)

    def parse(self, output: str, exit_code: int) -> TorchInfo | None:
        if exit_code == NOT_FOUND:
            return None
        # its answer is its last line, one JSON object (the interpreter's path and version before it)
        lines = output.strip().splitlines()
        if not lines or not lines[-1].startswith("{"):
            raise FactParseError(f"the torch probe printed nothing (exit code {exit_code})")
        data = json.loads(lines[-1])
        data.pop("cached", None)
        known = {k: v for k, v in data.items() if k in TorchInfo.__dataclass_fields__}
        return TorchInfo(**known)


class WallClock(Fact[float]):
    """The node's wall clock (Unix time, sub-second). The preflight dates the line's arrival to
    measure the offset from the controller's clock (steps/preflight/rounds.py)."""

    name = "clock"

    def command(self, platform: Platform) -> str:
        return "date +%s.%N"

    def parse(self, output: str, exit_code: int) -> float:
        lines = output.strip().splitlines()
        try:
            return float(lines[-1])
        except (IndexError, ValueError):
            # busybox date prints "%N" literally: no sub-second answer
            raise FactParseError(f"`date +%s.%N` printed {output.strip()[:40]!r} (GNU date needed)") from None


@dataclass(frozen=True)
class RootAccess:
    """Whether commands can become root on the node without a password: what the firewall and time
    steps need (they run ``sudo -n`` for users other than root, and never type a password)."""

    user: str
    method: str | None  # "root" (the login is root), "sudo" (sudo -n works), None (neither)
    detail: str = ""  # why not: sudo's own words, or "sudo is not installed"


class BecomeRoot(Fact[RootAccess]):
    """``sudo -n`` exactly as the steps that change the system call it (``Platform.wrap(become=True)``):
    a password prompt or a missing sudoers entry makes it fail at once instead of asking."""

    name = "root_access"

    def command(self, platform: Platform) -> str:
        posix = platform.as_posix()
        if posix is None:
            raise ValueError("root access is read from a POSIX shell only (Linux, WSL)")
        # wrap(become=True) is "root already: run it; else sudo -n -- /bin/sh -c ...": the same test
        # of the user id, then the same sudo call; stdin is /dev/null, so sudo cannot ask anything.
        # One `id` answers both the user's name and id ("uid=1000(alice) gid=..."; no name: the id).
        return (
            "i=$(LC_ALL=C id) || i=\n"
            "u=${i#uid=}; u=${u%%[!0-9]*}\n"
            'case $i in "uid=$u("*) n=${i#"uid=$u("}; n=${n%%")"*} ;; *) n=$u ;; esac\n'
            "printf '%s\\n' \"${n:-?}\"\n"
            'if [ "$u" = 0 ]; then echo "root-login"; exit 0; fi\n'
            "command -v sudo >/dev/null 2>&1 || { echo no-sudo; exit 0; }\n"
            f"{{ {posix.sudo('true')}\n}} 2>&1 && echo sudo-ok || echo sudo-refused"
        )

    def parse(self, output: str, exit_code: int) -> RootAccess:
        lines = [line for line in output.strip().splitlines() if line.strip()]
        if len(lines) < 2:
            raise FactParseError("no answer")
        user, verdict, said = lines[0].strip(), lines[-1].strip(), lines[1:-1]
        if verdict == "root-login":
            return RootAccess(user, "root")
        if verdict == "sudo-ok":
            return RootAccess(user, "sudo")
        if verdict == "no-sudo":
            return RootAccess(user, None, "sudo is not installed")
        if verdict == "sudo-refused":
            words = " ".join(line.strip() for line in said).removeprefix("sudo: ").strip()
            return RootAccess(user, None, words or "sudo -n failed")
        raise FactParseError(f"unexpected last line {verdict!r}")


def linux_facts(interpreter: str) -> list[Fact[Any]]:
    """The facts `bootstrap check` gathers from a Linux node."""
    return [
        Hostname(),
        OsRelease(),
        Kernel(),
        CpuCount(),
        Memory(),
        Python(interpreter),
        Gpus(),
        Torch(interpreter),
    ]


def public_value(value: Any) -> Any:
    """A fact value as JSON-ready data."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (tuple, list)):
        return [public_value(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return _public(value)
    raise TypeError(f"no JSON form for {type(value).__name__}")

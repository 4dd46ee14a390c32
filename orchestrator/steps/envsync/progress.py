"""What a node's environment build is doing now, read from the installer's own lines (pure logic).

pip (``--progress-bar off``, or ``raw`` from pip 24.1: ``Progress DONE of TOTAL`` lines while a file
downloads) and uv print what they collect, download and install; the build script says each of its
own steps in a record (``step``, read with the build's nonce: :meth:`InstallProgress.set`), which no
installer line can imitate. :class:`InstallProgress` keeps the current activity
("installing torch") and the bytes downloaded so far, for the per-node progress display
(orchestrator/cli/ui.py): bytes only where the installer reports them (a wheel found in a local
directory or the pip cache is not downloaded).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

from orchestrator.view import human_bytes

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
_SIZE = r"\(([\d.]+)\s*([kKMG]i?B|B|bytes)\)"
# pip: "  Downloading torch-2.13.0+cpu-cp311-...whl (191.8 MB)" (older pip: a URL); uv: "Downloading
# torch (183.0MiB)"
_DOWNLOADING = re.compile(r"^\s*Downloading\s+(\S+)\s+" + _SIZE)
_RAW = re.compile(r"^Progress (\d+) of (\d+)\s*$")  # pip --progress-bar raw
_COLLECTING = re.compile(r"^\s*Collecting\s+([A-Za-z0-9][A-Za-z0-9._-]*)")
_PROCESSING = re.compile(r"^\s*Processing\s+\S*?([A-Za-z0-9][A-Za-z0-9_.]*?)-\d")
_INSTALLING = re.compile(r"^\s*Installing collected packages:\s*(.+)$")
_UV_INSTALLED = re.compile(r"^\s*(Installed|Prepared|Resolved)\s+(\d+)\s+packages?")


def parse_size(number: str, unit: str) -> int:
    return int(float(number) * _UNITS.get(unit.lower().replace("bytes", "b"), 1))


def _package_of(file_or_url: str) -> str:
    """``torch`` for ``https://.../torch-2.13.0%2Bcpu-cp311-...whl`` or ``torch-2.13.0...whl``."""
    name = file_or_url.rsplit("/", 1)[-1]
    return re.split(r"-\d", name, maxsplit=1)[0] or name


def _installing(names: str) -> str:
    packages = [n.strip() for n in names.split(",") if n.strip()]
    if not packages:
        return "installing"
    # the package a user waits for, when it is among them
    main = next((p for p in packages if p.lower() == "torch"), packages[-1])
    others = len(packages) - 1
    return f"installing {main}" + (f" and {others} more" if others else "")


@dataclass
class Snapshot:
    activity: str
    downloaded: int  # bytes, completed downloads plus the current one's progress

    def detail(self) -> str:
        return f"{human_bytes(self.downloaded)} downloaded" if self.downloaded else ""


class InstallProgress:
    """Fed every line of one node's build (from the transport's reader thread), read by the display."""

    def __init__(self, activity: str = "starting") -> None:
        self._lock = threading.Lock()
        self._activity = activity
        self._done_bytes = 0  # downloads finished
        self._current_total = 0  # the download in progress: its announced size
        self._current_done = 0  # and how much of it arrived (raw progress), else 0

    def set(self, activity: str) -> None:
        with self._lock:
            self._finish_download()
            self._activity = activity

    def _finish_download(self) -> None:
        self._done_bytes += self._current_total
        self._current_total = self._current_done = 0

    def feed(self, line: str) -> None:
        """One line the installer printed (the build's own steps come through :meth:`set`)."""
        with self._lock:
            raw = _RAW.match(line)
            if raw:
                done, total = int(raw.group(1)), int(raw.group(2))
                self._current_done = done
                if total:
                    self._current_total = total
                return
            down = _DOWNLOADING.match(line)
            if down:
                self._finish_download()
                self._current_total = parse_size(down.group(2), down.group(3))
                self._activity = f"downloading {_package_of(down.group(1))}"
                return
            if not line.strip() or (line.startswith((" ", "\t")) and "Downloading" not in line):
                return  # a continuation line ("  Using cached ...", "  Preparing metadata ...")
            for pattern, verb in ((_COLLECTING, "collecting"), (_PROCESSING, "unpacking")):
                match = pattern.match(line)
                if match:
                    self._finish_download()
                    self._activity = f"{verb} {match.group(1)}"
                    return
            installing = _INSTALLING.match(line)
            if installing:
                self._finish_download()
                self._activity = _installing(installing.group(1))
                return
            uv = _UV_INSTALLED.match(line)
            if uv:
                self._finish_download()
                self._activity = {"Resolved": "downloading", "Prepared": "installing"}.get(
                    uv.group(1), "listing the environment"
                )

    def snapshot(self) -> Snapshot:
        with self._lock:
            activity = self._activity
            if self._current_total and not self._current_done and activity.startswith("downloading "):
                # no byte counts from this installer: the size it announced
                activity += f", {human_bytes(self._current_total)}"
            return Snapshot(activity, self._done_bytes + self._current_done)

"""chrony on Linux nodes: what the node has (probe), the configuration we want, and the POSIX scripts that
apply, await and undo it. Pure functions plus script text; nothing here runs anything: the probe in
``probe.py``, the configuration and the scripts that write, start and undo it in ``config.py``, awaiting
a source and reading ``chronyc`` in ``wait.py``. Use them through this package (``chrony.plan_config``).

Where our configuration goes (chrony reads one main file; see chrony.conf(5)):

- ``dropin``: the main file has a ``confdir`` (Debian/Ubuntu: ``/etc/chrony/conf.d``): we add
  ``<confdir>/cluster-bootstrap.conf`` and never touch the distribution's file.
- ``block``: no ``confdir`` (RHEL's ``/etc/chrony.conf``): a block between BEGIN/END markers is appended
  to the main file, after a byte-exact backup of it.
- ``file``: chronyd is installed but has no main file at all (minimal images, the test namespaces): we
  write the whole file, marked as ours.

Every file we change is first copied to ``<file>.cluster-bootstrap.bak`` (only when it was not ours and no
backup exists yet, so a second run keeps the true original); ``<main>.cluster-bootstrap.state`` records
what we started (a chronyd pid, or a systemd unit that was inactive) so ``--restore`` stops exactly that.
"""

from __future__ import annotations

from orchestrator.steps.timesync.chrony.config import (
    LOCAL_STRATUM,
    ChronyRole,
    FileChange,
    ForeignChronyd,
    RestorePlan,
    directives,
    install_command,
    peer_address,
    plan_config,
    plan_restore,
    replace_block,
    standalone_config,
    start_script,
    time_source,
    write_file_script,
)
from orchestrator.steps.timesync.chrony.probe import (
    BACKUP_SUFFIX,
    BLOCK_BEGIN,
    BLOCK_END,
    DEFAULT_PIDFILE,
    DROPIN_NAME,
    HEADER,
    MAIN_CANDIDATES,
    MARK,
    STATE_SUFFIX,
    Probe,
    confdirs,
    parse_probe,
    parse_state,
    probe_script,
)
from orchestrator.steps.timesync.chrony.wait import (
    NO_REPLY_EXIT,
    NTP_PORT,
    NTPDATA,
    SOURCES,
    SYNC_TIMEOUT,
    TRACKING,
    UNANSWERED_REQUESTS,
    WAIT,
    SourceLine,
    Traffic,
    WaitAnswer,
    describe_sources,
    parse_ntpdata,
    parse_sources,
    parse_tracking,
    parse_wait,
    wait_sections,
)

__all__ = [
    "BACKUP_SUFFIX",
    "BLOCK_BEGIN",
    "BLOCK_END",
    "DEFAULT_PIDFILE",
    "DROPIN_NAME",
    "HEADER",
    "LOCAL_STRATUM",
    "MAIN_CANDIDATES",
    "MARK",
    "NO_REPLY_EXIT",
    "NTPDATA",
    "NTP_PORT",
    "SOURCES",
    "STATE_SUFFIX",
    "SYNC_TIMEOUT",
    "TRACKING",
    "UNANSWERED_REQUESTS",
    "WAIT",
    "ChronyRole",
    "FileChange",
    "ForeignChronyd",
    "Probe",
    "RestorePlan",
    "SourceLine",
    "Traffic",
    "WaitAnswer",
    "confdirs",
    "describe_sources",
    "directives",
    "install_command",
    "parse_ntpdata",
    "parse_probe",
    "parse_sources",
    "parse_state",
    "parse_tracking",
    "parse_wait",
    "peer_address",
    "plan_config",
    "plan_restore",
    "probe_script",
    "replace_block",
    "standalone_config",
    "start_script",
    "time_source",
    "wait_sections",
    "write_file_script",
]

"""POSIX ``sh``: Linux nodes (and, later, commands inside WSL distributions)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from orchestrator.platforms.base import Platform, check_env_name

#: exit code reported when ``cd`` into the working directory fails (what ``env -C`` uses: 125).
CWD_FAILED_EXIT = 125

#: what sudo prints when ``-n`` refuses because it would have to ask for a password
SUDO_PASSWORD_MARKERS = ("a password is required", "a terminal is required")


class PosixShell(Platform):
    name = "posix"

    def quote(self, value: str) -> str:
        # Single quotes keep every byte except the single quote itself, which shlex closes,
        # escapes and reopens ('"'"'). Works in sh, bash, dash, zsh and ksh alike.
        return shlex.quote(value)

    def _script(self, command: str, env: Mapping[str, str] | None, cwd: str | None) -> str:
        lines: list[str] = []
        if cwd:
            lines.append(f"cd {self._path_word(cwd)} || exit {CWD_FAILED_EXIT}")
        for name, value in (env or {}).items():
            lines.append(f"export {check_env_name(name)}={self.quote(value)}")
        lines.append(command)
        return "\n".join(lines)

    def _path_word(self, path: str) -> str:
        # "~" and "~/x" must expand on the node (the user's home there), the rest stays literal.
        if path == "~":
            return '"$HOME"'
        if path.startswith("~/"):
            return '"$HOME"/' + self.quote(path[2:])
        return self.quote(path)

    def wrap(
        self,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        become: bool = False,
    ) -> str:
        # Always run through /bin/sh -c: the login shell sshd starts may be fish or csh, whose
        # quoting differs; a single POSIX-quoted word survives any of them.
        script = self._script(command, env, cwd)
        inner = f"/bin/sh -c {self.quote(script)}"
        if not become:
            return inner
        # Root already: no sudo (containers, root logins). Otherwise sudo -n never prompts: it fails
        # at once with "a password is required", which the caller turns into a clear error.
        return f'if [ "$(id -u)" = 0 ]; then {inner}; else sudo -n -- {inner}; fi'

    def stop_on_hangup(self, command: str) -> str:
        """``command`` in its own process group, killed when our stdin reaches end-of-file.

        A remote command outlives its SSH channel (no pty, no SIGHUP), so a timeout or a Ctrl-C on
        the controller would leave it running. The transport keeps the channel's stdin open and
        closes it to cancel: a watcher blocked on that stdin then signals the whole group (TERM,
        KILL 5 s later). ``setsid`` gives the command its own process group (dash refuses ``set -m``
        without a terminal); the command's own stdin is /dev/null, so it cannot eat the watcher's EOF.
        """
        # Background jobs of a non-interactive sh get /dev/null as stdin (POSIX), so the channel's
        # stdin is kept on fd 3 for the watcher.
        job = f"/bin/sh -c {self.quote(command)} </dev/null 3<&- &"  # any shell text, compound or not
        script = (
            "exec 3<&0\n"
            "if command -v setsid >/dev/null 2>&1; then\n"
            f"  setsid {job}\n"
            "else\n"
            f"  {job}\n"
            "fi\n"
            "pid=$!\n"
            # kill -PID reaches the group; without setsid the group does not exist: the pid alone
            '{ cat <&3 >/dev/null; kill -TERM -"$pid" || kill -TERM "$pid"; sleep 5;'
            ' kill -KILL -"$pid" || kill -KILL "$pid"; } >/dev/null 2>&1 &\n'
            "watcher=$!\n"
            "exec 3<&-\n"
            'wait "$pid"; rc=$?\n'
            'kill "$watcher" 2>/dev/null\n'
            'exit "$rc"'
        )
        return f"/bin/sh -c {self.quote(script)}"

    def sectioned(self, sections: Sequence[tuple[str, str]], token: str) -> str:
        parts = []
        for name, command in sections:
            begin = self.quote(f"@@{token} begin {name}@@")
            # stderr of fact commands is noise (missing tools); each fact reports failures itself.
            parts.append(
                f"printf '%s\\n' {begin}\n"
                f"( {command}\n) 2>/dev/null </dev/null\n"
                f"printf '\\n@@{token} end {name} %s@@\\n' \"$?\""
            )
        return "\n".join(parts)

    def transfer_path(self, path: str) -> str:
        # SFTP paths are relative to the login directory; "~/" means exactly that.
        if path == "~":
            return "."
        if path.startswith("~/"):
            return path[2:]
        return path

    def ensure_authorized_key(self, public_line: str) -> str:
        """Add ``public_line`` to ~/.ssh/authorized_keys unless present; prints ``added`` or ``present``.

        Permissions follow sshd's StrictModes (700 dir, 600 file); a file without a final newline
        gets one first, so the new key never fuses with the last line.
        """
        key = self.quote(public_line)
        return (
            "umask 077\n"
            'd="$HOME/.ssh"; f="$d/authorized_keys"\n'
            'mkdir -p "$d" && chmod 700 "$d" && touch "$f" && chmod 600 "$f" || exit 1\n'
            f'if grep -qxF -- {key} "$f"; then echo present; exit 0; fi\n'
            'if [ -s "$f" ] && [ -n "$(tail -c 1 "$f")" ]; then echo >> "$f"; fi\n'
            f"printf '%s\\n' {key} >> \"$f\" && echo added"
        )

    @staticmethod
    def sudo_refused(stderr: str) -> bool:
        return any(marker in stderr for marker in SUDO_PASSWORD_MARKERS)

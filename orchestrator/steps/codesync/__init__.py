"""Code sync: the project directory pushed to every node (the code half of `bootstrap sync`).

See :func:`sync_code` (the entry point), :mod:`.ignore` (what is left out), :mod:`.manifest` (the
project's files and hashes) and :mod:`.sync` (the per-node work). docs/sync.md is the user's guide.
"""

from __future__ import annotations

from orchestrator.steps.codesync.ignore import DEFAULT_EXCLUDES, IgnoreRules
from orchestrator.steps.codesync.manifest import Changes, FileEntry, LocalTree, build_tree, diff
from orchestrator.steps.codesync.sync import (
    CodeDestRefused,
    CodeInUseError,
    CodeSyncResult,
    ProgressFn,
    code_dest,
    code_source,
    prepare_tree,
    sync_code,
    sync_node,
)

__all__ = [
    "DEFAULT_EXCLUDES",
    "Changes",
    "CodeDestRefused",
    "CodeInUseError",
    "CodeSyncResult",
    "FileEntry",
    "IgnoreRules",
    "LocalTree",
    "ProgressFn",
    "build_tree",
    "code_dest",
    "code_source",
    "diff",
    "prepare_tree",
    "sync_code",
    "sync_node",
]

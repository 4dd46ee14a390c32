"""The live dashboard: a page served from the controller (``bootstrap dashboard``, ``--dashboard``),
fed by the streams a command already reads; see docs/dashboard.md."""

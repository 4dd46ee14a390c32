"""Command line interface (``bootstrap``).

``main.py`` holds the group and the main pipeline's presentation; each area's subcommands live in their
own module and are registered by ``main.py``; what they share is in ``common.py``.
"""

import gc
import sys


def main() -> None:
    """The ``bootstrap`` console script.

    Importing the CLI makes about 70,000 objects the cyclic garbage collector tracks (click commands,
    pydantic models, dataclasses, functions), which live as long as the process; the collector would
    walk them again and again while they are made: about a sixth of the CPU a short command such as
    ``bootstrap status`` costs. So the collector waits until the imports are done, and what they made
    is then set aside for good (``gc.freeze``): later collections only look at what the command
    itself creates."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        from orchestrator.cli.main import main as run
    except KeyboardInterrupt:  # Ctrl-C while the CLI loads: nothing was read or started yet
        sys.stderr.write("error: interrupted before anything started\n")
        raise SystemExit(130) from None
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
    run()


__all__ = ["main"]

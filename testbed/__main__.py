"""``python -m testbed``: maps errors to exit codes and short messages.

Set TESTBED_DEBUG=1 to see full tracebacks.
"""
from __future__ import annotations

import logging
import os
import sys

from testbed.errors import EXIT_INTERNAL, TestbedError


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (0 ok, 1 cells failed, 2 bad input, 3 machine,
    4 internal error: a bug, reported with its type; TESTBED_DEBUG=1 shows the traceback)."""
    debug = os.environ.get("TESTBED_DEBUG") == "1"
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    # The console shows warnings (or everything when debugging) even when a run raises the
    # root level to INFO for its run.log.
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.DEBUG if debug else logging.WARNING)
    from testbed import cli

    try:
        return cli.main(argv)
    except TestbedError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the one place that turns surprises into messages
        if debug:
            raise
        print(f"internal error: {type(e).__name__}: {e} (set TESTBED_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())

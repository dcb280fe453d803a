"""The `kog` command line."""

import sys


def entry_point() -> None:
    """The `kog` command: a Ctrl+C while its modules still load exits 130 like one later, without a traceback."""
    try:
        from kogcli.main import run
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    run()

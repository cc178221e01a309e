"""The ``zett-agent`` command line."""

from __future__ import annotations

import argparse
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]

_EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "_examples" / "async_subagent.py"


def _demo(args: argparse.Namespace) -> int:
    """Run the guide's background-subagent example (offline models, no API key)."""
    if not _EXAMPLE.is_file():
        print(
            f"zett-agent demo: the example {_EXAMPLE} is missing; run the demo from a "
            "checkout of the repository",
            file=sys.stderr,
        )
        return 2
    runpy.run_path(str(_EXAMPLE), run_name="__main__")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the subcommand, return the exit status."""
    parser = argparse.ArgumentParser(
        prog="zett-agent",
        description="An asyncio agent framework whose child agents run in their own processes.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run an offline demo of background subagents")
    demo.set_defaults(handler=_demo)
    args = parser.parse_args(argv)
    status: int = args.handler(args)
    return status


if __name__ == "__main__":
    sys.exit(main())

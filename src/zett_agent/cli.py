"""The ``zett-agent`` command line."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the subcommand, return the exit status."""
    from zett_agent._demo import _cli as demo
    from zett_agent._mcp import _cli as mcp

    parser = argparse.ArgumentParser(
        prog="zett-agent",
        description=(
            "zett_agent: an asyncio agent framework whose child agents each run in their own "
            "OS process, hard-killable, with limits. Commands:"
        ),
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo.add_parser(commands)
    mcp.add_parser(commands)
    args = parser.parse_args(argv)
    status: int = args.handler(args)
    return status


if __name__ == "__main__":
    sys.exit(main())

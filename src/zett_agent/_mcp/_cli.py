"""The ``mcp`` subcommand."""

from __future__ import annotations

import argparse
import asyncio
import sys

DESCRIPTION = """\
Serve background child agents to an MCP client over stdio: the task tools task_start,
task_list, task_status, task_output and task_cancel, for the children whose SubAgentDefinitions
MODULE:ATTR names (a sequence of definitions, or a function returning one; MODULE is imported
from the current directory). Every child runs in its own OS process; when the client goes away,
every child's process tree is killed. Needs the mcp extra: pip install 'zett-agent[mcp]'.
"""

#: exit status for a bad command line or definitions module (argparse's own)
EXIT_USAGE = 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "mcp",
        help="serve background child agents to an MCP client (stdio)",
        description=DESCRIPTION,
    )
    parser.add_argument(
        "target",
        metavar="MODULE:ATTR",
        help="the definitions to serve, for example myproject.children:DEFINITIONS",
    )
    parser.add_argument(
        "--max-concurrent",
        type=int,
        default=4,
        metavar="N",
        help="tasks the client may run at once (default 4)",
    )
    parser.add_argument(
        "--sandbox",
        action="store_true",
        help="run every child whose definition sets no sandbox in a default Sandbox() "
        "(its files, network, environment and account confined)",
    )
    parser.set_defaults(handler=run)


def _fail(message: str) -> int:
    print(f"zett-agent mcp: {message}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    if args.max_concurrent < 1:
        return _fail(f"--max-concurrent must be >= 1, got {args.max_concurrent}")
    try:
        from zett_agent._mcp import _server
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] not in ("mcp", "mcp_types"):
            raise
        return _fail("needs the mcp extra: pip install 'zett-agent[mcp]'")
    from zett_agent._mcp._load import DefinitionsError, load_definitions

    try:
        definitions = load_definitions(args.target)
    except DefinitionsError as exc:
        return _fail(str(exc))
    try:
        extension, bells = _server.make_extension(
            definitions, max_concurrent=args.max_concurrent, sandbox=args.sandbox
        )
    except (TypeError, ValueError) as exc:
        return _fail(str(exc))
    asyncio.run(_server.serve_stdio(extension, bells))
    return 0

"""The ``mcp`` subcommand."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zett_agent._mcp._watch import Bells
    from zett_agent.extensions._async_subagent import AsyncSubAgentExtension

DESCRIPTION = """\
Serve background child agents to MCP clients, over stdio (default) or Streamable HTTP (--http).
MODULE:ATTR names the SubAgentDefinitions to serve (a sequence, or a function returning one;
MODULE is imported from the current directory). Each child is a tool of its own (called plainly
it runs the child and answers with its report; called as an MCP task it answers at once), beside
the task tools task_start, task_list, task_status, task_output and task_cancel. Every child runs
in its own OS process. Over stdio, when the client goes away every child's process tree is
killed; over HTTP each session is a client with its own tasks. Needs the mcp extra:
pip install 'zett-agent[mcp]'.
"""

#: exit status for a bad command line or definitions module (argparse's own)
EXIT_USAGE = 2

#: the longest MCP task lifetime granted by default: one day
DEFAULT_MAX_TASK_TTL = 86_400.0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "mcp",
        help="serve background child agents to MCP clients (stdio or HTTP)",
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
        help="tasks each client may run at once (default 4)",
    )
    parser.add_argument(
        "--sandbox",
        action="store_true",
        help="run every child whose definition sets no sandbox in a default Sandbox() "
        "(its files, network, environment and account confined)",
    )
    parser.add_argument(
        "--max-task-ttl",
        type=float,
        default=DEFAULT_MAX_TASK_TTL,
        metavar="SECONDS",
        help="the longest lifetime an MCP task gets, whatever it asks (default one day); "
        "when it ends, the task is deleted and its child killed",
    )
    parser.add_argument(
        "--http",
        metavar="[HOST:]PORT",
        help="serve Streamable HTTP on HOST:PORT (HOST default 127.0.0.1; PORT 0 picks a free "
        "one) instead of stdio; a bearer token is required, generated and printed once",
    )
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        help="with --http: read the bearer token from this file instead of generating one",
    )
    parser.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="with --http: also allow browser pages of this origin (https://app.example); "
        "pages on 127.0.0.1, localhost and [::1] are always allowed",
    )
    parser.set_defaults(handler=run)


def _fail(message: str) -> int:
    print(f"zett-agent mcp: {message}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def _say(message: str) -> None:
    print(f"zett-agent mcp: {message}", file=sys.stderr, flush=True)


def http_address(text: str) -> tuple[str, int]:
    """``[HOST:]PORT`` as a host and a port; ``ValueError`` saying what is wrong."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(
            f"--http {text!r}: give [HOST:]PORT with a port from 0 to 65535, for example "
            "--http 127.0.0.1:8765"
        )
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(
                f"--http {text!r}: {host!r} is not an IP address; give one (127.0.0.1, ::1, "
                "0.0.0.0) or localhost"
            ) from None
    return ("127.0.0.1" if host == "localhost" else host), int(port_text)


def run(args: argparse.Namespace) -> int:
    if args.max_concurrent < 1:
        return _fail(f"--max-concurrent must be >= 1, got {args.max_concurrent}")
    if not 1 <= args.max_task_ttl <= 365 * 86_400:
        return _fail(
            f"--max-task-ttl must be from 1 to {365 * 86_400} seconds, got {args.max_task_ttl}"
        )
    if args.http is None and (args.token_file is not None or args.allow_origin):
        return _fail("--token-file and --allow-origin go with --http; add --http [HOST:]PORT")
    address = None
    if args.http is not None:
        try:
            address = http_address(args.http)
        except ValueError as exc:
            return _fail(str(exc))
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
    max_ttl_ms = int(args.max_task_ttl * 1000)
    if address is None:
        from zett_agent._mcp._stdio import serve_stdio

        asyncio.run(serve_stdio(extension, bells, max_ttl_ms=max_ttl_ms))
        return 0
    return _run_http(args, address, extension, bells, max_ttl_ms)


def _run_http(
    args: argparse.Namespace,
    address: tuple[str, int],
    extension: AsyncSubAgentExtension,
    bells: Bells,
    max_ttl_ms: int,
) -> int:
    from zett_agent._mcp._http import listen, serve_http, url_of
    from zett_agent._mcp._http_guard import TokenError, is_loopback, new_token, read_token

    if args.token_file is not None:
        try:
            token = read_token(args.token_file)
        except TokenError as exc:
            return _fail(str(exc))
    else:
        token = new_token()
    host, port = address
    try:
        sock = listen(host, port)
    except OSError as exc:
        return _fail(f"cannot listen on {args.http}: {exc.strerror or exc}")

    def ready() -> None:
        _say(f"serving {url_of(sock)}")
        if args.token_file is None:
            _say(f"bearer token (shown once; send it as 'Authorization: Bearer TOKEN'): {token}")
        else:
            _say(f"bearer token: the one in {args.token_file}")
        if not is_loopback(host):
            _say(
                f"listening on {host}, not a loopback address: anyone who can reach it and "
                "holds the token can run children"
            )

    asyncio.run(
        serve_http(
            extension,
            bells,
            sock,
            token=token,
            max_ttl_ms=max_ttl_ms,
            origins=args.allow_origin,
            ready=ready,
        )
    )
    return 0

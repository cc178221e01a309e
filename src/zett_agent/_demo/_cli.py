"""The ``demo`` subcommand."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from zett_agent._demo._scenario import SESSION, DemoOptions, default_root, run_demo

DESCRIPTION = """\
Run the zett_agent demo, offline, no API key: a parent agent starts background children
through the real task tools, each child in its own OS process. Several hash the files of a
folder (real CPU work, in parallel); one spins forever and is hard-cancelled (its process tree
is killed); one segfaults and fails cleanly. The parent keeps working meanwhile and then reads
the reports. A live table shows status, pid, CPU, memory, turns, last tool and elapsed time.
"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo", help="run the background-subagents demo (offline)", description=DESCRIPTION
    )
    parser.add_argument(
        "path",
        nargs="?",
        default=None,
        help="folder whose files the children hash (default: zett_agent's own source)",
    )
    parser.add_argument(
        "--hashers", type=int, default=4, help="hashing children to start (default 4)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=40000,
        help="hash rounds per file: more is more CPU work (default 40000)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print machine-readable results instead of the view"
    )
    parser.add_argument("--plain", action="store_true", help="no live view (for logs and pipes)")
    parser.add_argument(
        "--model",
        default=None,
        help="run parent and children on a real model, e.g. openai:gpt-4o-mini",
    )
    parser.add_argument(
        "--base-url", default=None, help="base URL of an OpenAI-compatible endpoint"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    root = args.path or default_root()
    if not Path(root).is_dir():
        print(f"zett-agent demo: {root!r} is not a folder", file=sys.stderr)
        return 2
    if args.hashers < 1 or args.rounds < 1:
        print("zett-agent demo: --hashers and --rounds must be >= 1", file=sys.stderr)
        return 2
    model = None
    if args.model:
        from zett_agent.models import model_from_spec

        try:
            model = model_from_spec(args.model, base_url=args.base_url)
        except ValueError as exc:
            print(f"zett-agent demo: {exc}", file=sys.stderr)
            return 2
    options = DemoOptions(
        root=str(Path(root).resolve()), hashers=args.hashers, rounds=args.rounds, model=model
    )
    if args.json:
        result = asyncio.run(run_demo(options))
        print(json.dumps(result.to_json(), indent=2))
        return 0
    return _run_with_view(options, plain=args.plain or not sys.stdout.isatty())


def _run_with_view(options: DemoOptions, *, plain: bool) -> int:
    from rich.live import Live

    from zett_agent._demo._view import console, live_table, summary

    out = console(plain)
    out.print(f"[bold]zett_agent demo[/bold]: children hash {options.root}")
    if plain:
        result = asyncio.run(run_demo(options))
    else:
        with Live(console=out, auto_refresh=False, transient=True) as live:

            def redraw(extension: object) -> None:
                live.update(live_table(extension, SESSION), refresh=True)  # type: ignore[arg-type]

            result = asyncio.run(run_demo(options, on_progress=redraw))
    out.print(summary(result.to_json()))
    return 0

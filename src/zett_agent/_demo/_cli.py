"""The ``demo`` subcommand."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zett_agent._demo._scenario import (
    DEFAULT_TIMEOUT,
    LARGE_RUN_SECONDS,
    MAX_HASHERS,
    SESSION,
    DemoOptions,
    DemoResult,
    default_root,
    estimate,
    run_demo,
)

if TYPE_CHECKING:
    from zett_agent.extensions.async_subagent import AsyncSubAgentExtension

DESCRIPTION = """\
Run the zett_agent demo, offline, no API key: a parent agent starts background children
through the real task tools, each child in its own OS process. Several hash the files of a
folder (real CPU work, in parallel); one spins forever and is hard-cancelled (its process tree
is killed); one segfaults and fails cleanly. The parent keeps working meanwhile and then reads
the reports. A live table shows each task's status, pid, files hashed, CPU, memory and time.
"""

#: ``--ray`` without an address: a local Ray started for the demo
LOCAL_RAY = "local"

#: Exit statuses: bad arguments (argparse's own), the run failed or timed out, interrupted.
EXIT_USAGE, EXIT_FAILED, EXIT_INTERRUPTED = 2, 1, 130


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
        "--hashers",
        type=int,
        default=4,
        help=f"hashing children to start, 1 to {MAX_HASHERS} (default 4)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=40000,
        help="hash rounds per file: more is more CPU work (default 40000)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"stop the run (and kill every child) after this long (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument(
        "--json", action="store_true", help="print machine-readable results instead of the view"
    )
    parser.add_argument(
        "--plain", action="store_true", help="no live view, progress lines instead (for logs)"
    )
    parser.add_argument(
        "--model",
        default=None,
        help="run parent and children on a real model, e.g. openai:gpt-4o-mini",
    )
    parser.add_argument(
        "--base-url", default=None, help="base URL of an OpenAI-compatible endpoint"
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const=LOCAL_RAY,
        default=None,
        metavar="ADDRESS",
        help="run the children as Ray tasks (needs the ray extra): a local Ray by default, or "
        "the cluster at ADDRESS ('auto', 'ray://host:10001'; the folder must exist on its nodes)",
    )
    parser.set_defaults(handler=run)


def _fail(message: str, status: int = EXIT_USAGE) -> int:
    print(f"zett-agent demo: {message}", file=sys.stderr)
    return status


def run(args: argparse.Namespace) -> int:
    root = Path(args.path or default_root())
    if not root.is_dir():
        return _fail(f"{str(root)!r} is not a folder; pass a folder whose files to hash")
    if not 1 <= args.hashers <= MAX_HASHERS:
        return _fail(f"--hashers must be between 1 and {MAX_HASHERS} (one process each)")
    if args.rounds < 1:
        return _fail("--rounds must be >= 1")
    if not 0 < args.timeout < float("inf"):
        return _fail("--timeout must be a positive number of seconds")
    model = None
    if args.model:
        from zett_agent.models import model_from_spec

        try:
            model = model_from_spec(args.model, base_url=args.base_url)
        except ValueError as exc:
            return _fail(str(exc))
    elif args.base_url:
        return _fail("--base-url needs --model too, for example --model openai:qwen2.5:7b")
    runner = None
    if args.ray is not None:
        if args.ray != LOCAL_RAY and Path(args.ray).is_dir():
            return _fail(
                f"--ray got {args.ray!r}, which is a folder: put the folder first "
                f"(zett-agent demo {args.ray} --ray) or give an address (--ray auto)"
            )
        from zett_agent._demo._scenario import ray_runner

        try:
            runner = ray_runner(None if args.ray == LOCAL_RAY else args.ray, args.hashers)
        except ImportError:
            return _fail("--ray needs the ray extra: pip install 'zett-agent[ray]'")
    options = DemoOptions(
        root=str(root.resolve()),
        hashers=args.hashers,
        rounds=args.rounds,
        model=model,
        timeout=args.timeout,
        runner=runner,
    )
    plain = args.plain or not sys.stdout.isatty()
    if not args.json:
        print(f"zett_agent demo: children hash the files of {options.root}", flush=True)
    from zett_agent._demo._work import list_files

    files = list_files(options.root)
    if not files:
        return _fail(
            f"{options.root} has no files to hash (tool folders such as .git and .venv are "
            "skipped); pass a folder that has files, or none for zett_agent's own source"
        )
    _warn_if_large(files, options)
    if runner is not None:
        where = "a local Ray" if args.ray == LOCAL_RAY else f"the Ray cluster at {args.ray}"
        if not args.json:
            print(f"zett_agent demo: connecting to {where} (seconds)...", flush=True)
        try:
            runner.connect()  # here, in the main thread: a local Ray lives as long as it
        except Exception as exc:
            return _fail(f"could not connect to {where}: {str(exc).splitlines()[0]}", EXIT_FAILED)
    try:
        if args.json:
            # Ray's driver prints a line to stdout for a worker that died (the crasher): keep
            # stdout for the JSON alone
            with contextlib.redirect_stdout(sys.stderr if runner is not None else sys.stdout):
                result = asyncio.run(run_demo(options, files=files))
            print(json.dumps(result.to_json(), indent=2))
        else:
            result = _run_with_view(options, files, plain=plain)
    except KeyboardInterrupt:
        return _fail("interrupted; every child's process tree was killed", EXIT_INTERRUPTED)
    except Exception as exc:
        from zett_agent.agent import AgentError
        from zett_agent.model import ModelError

        if isinstance(exc, ModelError | AgentError):
            return _fail(f"the parent agent failed: {exc}", EXIT_FAILED)
        raise
    if result.timed_out:
        return _fail(
            f"stopped by --timeout {args.timeout:g} after {result.wall_seconds:.1f} s: "
            f"{result.files_hashed} of {result.files} files hashed. Give it longer "
            f"(--timeout), less work per file (--rounds), or a smaller folder.",
            EXIT_FAILED,
        )
    return 0


def _warn_if_large(files: Sequence[Path], options: DemoOptions) -> None:
    cost = estimate(files, options)
    if cost.wall_seconds <= LARGE_RUN_SECONDS:
        return
    cores = min(options.hashers, os.cpu_count() or 1)
    quick = cost.rounds_for(options.rounds, 20.0)
    stop = (
        f"; --timeout {options.timeout:g} s will stop it first"
        if cost.wall_seconds > options.timeout
        else ""
    )
    print(
        f"zett-agent demo: warning: {cost.files:,} files ({cost.bytes / 2**20:,.0f} MiB) at "
        f"--rounds {options.rounds} is about {_duration(cost.cpu_seconds)} of CPU, "
        f"{_duration(cost.wall_seconds)} on {cores} cores{stop}. For a run of about 20 s: "
        f"--rounds {quick}.",
        file=sys.stderr,
        flush=True,
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _run_with_view(options: DemoOptions, files: Sequence[Path], *, plain: bool) -> DemoResult:
    from zett_agent._demo._view import REFRESH_PER_SECOND, LiveTasks, console, progress_line

    out = console(plain)
    if plain:
        begin = time.monotonic()

        def tick(extension: AsyncSubAgentExtension) -> None:
            # Runs on the loop: one short line every couple of seconds.
            line = progress_line(extension.tasks(SESSION), len(files), time.monotonic() - begin)
            print(line, flush=True)

        result = asyncio.run(run_demo(options, files=files, on_tick=tick))
    else:
        from rich.live import Live

        view = LiveTasks(out, SESSION, len(files), ray=options.runner is not None)
        view.warm_up()
        # rich's refresh thread draws the table at a bounded rate; the loop never waits for it.
        # A shorter switch interval hands the GIL back to the loop sooner when that thread draws.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(0.001)
        try:
            with Live(
                console=out,
                get_renderable=view,
                refresh_per_second=REFRESH_PER_SECOND,
                transient=True,
                # Ray's driver prints to stdout when a worker dies: above the table, not in it
                redirect_stdout=options.runner is not None,
                redirect_stderr=False,
            ):
                result = asyncio.run(run_demo(options, files=files, on_start=view.attach))
        finally:
            sys.setswitchinterval(interval)
    _print_summary(out, result)
    return result


def _print_summary(out: Any, result: DemoResult) -> None:
    from zett_agent._demo._view import summary

    out.print(summary(result.to_json(), width=out.size.width))

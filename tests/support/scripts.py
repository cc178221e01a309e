"""Running a program of a test in an interpreter of its own: a script, or the ``zett-agent``
command line, with its output captured as text (the caller checks the return code, or
``python_prints`` does)."""

from __future__ import annotations

import os
import subprocess
import sys


def offline_env() -> dict[str, str]:
    """This process's environment without any ``OPENAI_*`` setting (no real model, no key)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}


def run_python(
    *args: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run this interpreter with ``args``; ``subprocess.TimeoutExpired`` after ``timeout``."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def python_prints(code: str, timeout: float = 60) -> str:
    """What this interpreter prints running the program ``code`` (``-c``), stripped.
    ``AssertionError`` with its output if it fails, ``subprocess.TimeoutExpired`` after
    ``timeout``."""
    done = run_python("-c", code, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def zett_agent(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the ``zett-agent`` command line offline (``offline_env``) with ``args``."""
    return run_python("-m", "zett_agent.cli", *args, timeout=timeout, env=offline_env())

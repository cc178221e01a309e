"""CPython's own ``test_concurrent_futures``, run against the engine's ``ProcessPoolExecutor``.

The vendored copies (``vendored/``, see its ``PROVENANCE.md``) are CPython's files unchanged;
this conftest is the whole substitution, in one place:

- the process-pool mixins' ``executor_type``, and the ``futures`` name of every vendored module,
  give our ``ProcessPoolExecutor`` (the shim module ``_FUTURES`` is ``concurrent.futures`` with
  that one name changed); the thread-pool and ``Future`` classes test the standard library
  alone and are not collected;
- a test that runs a child interpreter (``assert_python_ok``) gets a prelude that makes that
  interpreter's ``concurrent.futures.ProcessPoolExecutor`` ours too, and finds the vendored
  module under the name the test's code imports it by;
- ``EXPECTED`` lists every test expected to differ, each with its reason: a documented
  difference (docs/executor.md, "What differs from the standard library") or a test that reads
  the standard library's internals. Each is an ``xfail(strict=True)``: a test listed here that
  passes fails the run, so the list cannot go stale.

Each Python runs its own version's copy (3.11 and 3.13; on 3.12 the 3.11 copy until CPython
3.12's is vendored: see ``vendored/PROVENANCE.md``). Of the process-pool classes only the
``spawn`` ones run: the ``fork`` and ``forkserver`` ones repeat them with another
``mp_context``, which the engine accepts and does not use.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import gc
import importlib
import sys
import types
from collections.abc import Iterator
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import pytest

from zett_agent.process import ProcessPoolExecutor
from zett_agent.process._host import _process_executor

HERE = Path(__file__).parent
VENDORED = HERE / "vendored"
#: which vendored copy each Python runs
COPIES = {(3, 11): "py311", (3, 12): "py311", (3, 13): "py313"}
COPY = COPIES.get(sys.version_info[:2])

try:
    import test.support  # noqa: F401  (the vendored tests' helpers: CPython's own test package)
except ImportError:  # a Python installed without its test package
    WHY_NOT: str | None = "this Python has no 'test' package (CPython's test support)"
else:
    WHY_NOT = None if COPY is not None else f"no vendored copy for Python {sys.version[:4]}"

collect_ignore_glob = [
    f"vendored/{name}/*" for name in sorted(set(COPIES.values())) if WHY_NOT or name != COPY
]


# -- the substitution -------------------------------------------------------------------------

#: ``concurrent.futures`` with ``ProcessPoolExecutor`` replaced by ours
_FUTURES = types.ModuleType("concurrent.futures")
_FUTURES.__dict__.update(vars(concurrent.futures))
_FUTURES.ProcessPoolExecutor = ProcessPoolExecutor  # type: ignore[attr-defined]
_FUTURES.ThreadPoolExecutor = concurrent.futures.ThreadPoolExecutor  # type: ignore[attr-defined]
_FUTURES.process = concurrent.futures.process  # type: ignore[attr-defined]

#: the vendored modules of this Python's copy, by the name a test's child imports them by
_MODULES = {
    "py311": {"test.test_concurrent_futures": "test_concurrent_futures"},
    "py313": {
        "test.test_concurrent_futures": "test_concurrent_futures",
        **{
            f"test.test_concurrent_futures.{name}": f"test_concurrent_futures.{name}"
            for name in ("util", "executor", "test_shutdown", "test_process_pool")
        },
    },
}


def _prelude(copy: str) -> str:
    """Code run first by a test's child interpreter: our executor, the vendored modules."""
    aliases = _MODULES[copy]
    lines = [
        "import sys, importlib, concurrent.futures",
        f"sys.path.insert(0, {str(VENDORED / copy)!r})",
        "import zett_agent.process",
        "concurrent.futures.ProcessPoolExecutor = zett_agent.process.ProcessPoolExecutor",
        *(
            f"sys.modules[{alias!r}] = importlib.import_module({real!r})"
            for alias, real in aliases.items()
        ),
    ]
    return "\n".join(lines) + "\n"


def _with_prelude(run: Any, prelude: str) -> Any:
    def assert_python_ok(*args: Any, **env_vars: Any) -> Any:
        if len(args) >= 2 and args[0] == "-c":
            args = ("-c", prelude + args[1], *args[2:])
        return run(*args, **env_vars)

    return assert_python_ok


def _substitute(copy: str) -> None:
    """Our executor into this Python's vendored copy, before pytest collects it."""
    sys.path.insert(0, str(VENDORED / copy))
    prelude = _prelude(copy)
    for real in _MODULES[copy].values():
        module = importlib.import_module(real)
        if hasattr(module, "futures"):
            module.futures = _FUTURES
        if hasattr(module, "assert_python_ok"):
            module.assert_python_ok = _with_prelude(module.assert_python_ok, prelude)
        for name in ("ProcessPoolForkMixin", "ProcessPoolForkserverMixin", "ProcessPoolSpawnMixin"):
            mixin = getattr(module, name, None)
            if mixin is not None:
                mixin.executor_type = ProcessPoolExecutor
    if copy == "py313":
        for name in ("test_as_completed", "test_deadlock", "test_init", "test_wait"):
            module = importlib.import_module(f"test_concurrent_futures.{name}")
            if hasattr(module, "futures"):
                module.futures = _FUTURES


if WHY_NOT is None and COPY is not None:
    _substitute(COPY)


@pytest.fixture(autouse=True)
def _close_what_a_test_left_open(request: pytest.FixtureRequest) -> Iterator[None]:
    """Close what a test left open, before the leak guard (tests/conftest.py) counts it.

    CPython's tests leave executors open where they expect a broken pool (``_check_crash``
    never shuts its executor down), keep queues on the test case, and let the end of the
    module or of the interpreter close them; here a test must leave nothing behind, so after
    each test its executors are shut down, what it kept is dropped, and multiprocessing's
    resource tracker (started by a test's semaphore or queue) is stopped, as CPython's module
    clean-up stops it.
    """
    yield
    _process_executor.close_all()
    instance = request.instance
    if instance is not None:
        vars(instance).clear()
    gc.collect()
    resource_tracker._resource_tracker._stop()


# -- what differs, and why ----------------------------------------------------------------------

_PROCESSES = (
    "reads the standard library's private _processes (its worker processes by pid), which the "
    "engine has not: its workers are its pool's (ProcessPoolExecutor.pool)"
)
_BROKEN_BY_A_CRASH = (
    "expects a worker's crash to break the whole pool (BrokenProcessPool for every future); the "
    "engine fails the crashed job's own future with WorkerCrashed and goes on (docs/executor.md)"
)
_BROKEN_BY_UNPICKLING = (
    "expects an error unpickling a job or its result to break the whole pool (BrokenProcessPool); "
    "the engine fails that job's own future with the error unpickling raised, and goes on "
    "(docs/executor.md)"
)

#: test name (or ``Class.test``, where one class of several differs) -> why it differs
EXPECTED: dict[str, str] = {
    # documented differences
    "ProcessPoolSpawnFailingInitializerTest.test_initializer": (
        "its initargs hold a multiprocessing.Queue, which the standard library hands to its "
        "workers by inheritance as it starts them; the engine's workers are not this "
        "process's children, and the Queue refuses to be pickled (RuntimeError: Queue objects "
        "should only be shared between processes through inheritance): a Manager().Queue() "
        "works (docs/executor.md)"
    ),
    "test_killed_child": _PROCESSES + "; and " + _BROKEN_BY_A_CRASH,
    "test_crash_at_task_unpickle": _BROKEN_BY_A_CRASH,
    "test_crash_during_func_exec_on_worker": _BROKEN_BY_A_CRASH,
    "test_crash_during_result_pickle_on_worker": _BROKEN_BY_A_CRASH,
    "test_shutdown_deadlock": _BROKEN_BY_A_CRASH,
    "test_crash_big_data": _BROKEN_BY_A_CRASH,
    "test_error_at_task_unpickle": _BROKEN_BY_UNPICKLING,
    "test_exit_at_task_unpickle": _BROKEN_BY_UNPICKLING,
    "test_error_during_result_unpickle_in_result_handler": _BROKEN_BY_UNPICKLING,
    "test_exit_during_result_unpickle_in_result_handler": _BROKEN_BY_UNPICKLING,
    "test_max_tasks_per_child_defaults_to_spawn_context": (
        "reads the standard library's private _mp_context, expecting the 'spawn' context it "
        "picks for max_tasks_per_child; the engine keeps the context given (the default one) "
        "and starts its workers its own way whatever it is (docs/executor.md)"
    ),
    # the standard library's internals
    "test_saturation": _PROCESSES,
    "test_idle_process_reuse_one": _PROCESSES,
    "test_idle_process_reuse_multiple": _PROCESSES,
    "test_max_tasks_per_child": _PROCESSES,
    "test_processes_terminate": _PROCESSES,
    "test_context_manager_shutdown": _PROCESSES,
    "test_del_shutdown": _PROCESSES + ", and its _executor_manager_thread and _call_queue",
    "test_shutdown_no_wait": _PROCESSES + ", and its _executor_manager_thread and _call_queue",
    "test_python_finalization_error": (
        "makes the second thread the standard library's executor starts fail (its queue "
        "feeder, after its manager thread), as at interpreter finalization, and expects "
        "BrokenProcessPool; the engine's executor started its one thread when it was made, so "
        "the map runs, and raises what mul((2, 3)) raises"
    ),
    "test_shutdown_deadlock_pickle": (
        "reads the standard library's private _executor_manager_thread"
    ),
}


def _expected(item: pytest.Item) -> str | None:
    cls = getattr(item, "cls", None)
    name = item.name
    if cls is not None and f"{cls.__name__}.{name}" in EXPECTED:
        return EXPECTED[f"{cls.__name__}.{name}"]
    return EXPECTED.get(name)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = str(VENDORED)
    keep, drop = [], []
    for item in items:
        if not str(item.path).startswith(here):
            keep.append(item)
            continue
        cls = getattr(item, "cls", None)
        if cls is None or not cls.__name__.startswith("ProcessPoolSpawn"):
            # the thread pool's and Future's own tests test the stdlib alone; the fork and
            # forkserver classes repeat the spawn ones with another mp_context, which the
            # engine accepts and does not use (its workers start its own way)
            drop.append(item)
            continue
        keep.append(item)
        why = _expected(item)
        if why is not None:
            item.add_marker(pytest.mark.xfail(reason=why, strict=True))
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep

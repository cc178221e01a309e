"""Process engine tests (every async test runs under asyncio and uvloop: tests/conftest.py)."""

from __future__ import annotations

import cloudpickle

from . import _jobs

# job functions travel by value, so a fresh worker never has to import the test package
cloudpickle.register_pickle_by_value(_jobs)

"""Process engine tests (every async test runs under asyncio and uvloop, and the contract
tests under both containment strategies: see tests/conftest.py)."""

from __future__ import annotations

import cloudpickle

from . import _attacks, _jobs

# job functions travel by value, so a fresh worker never has to import the test package
cloudpickle.register_pickle_by_value(_jobs)
cloudpickle.register_pickle_by_value(_attacks)

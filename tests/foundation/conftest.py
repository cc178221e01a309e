"""The foundation tests run every async test under asyncio and uvloop (see tests/conftest.py)."""

"""What the tests share: one package, imported one way, ``from support.<module> import ...``.

``tests/`` is on ``sys.path`` (pytest's ``pythonpath`` setting in pyproject.toml); the process
pool's launcher inherits it and the Ray cluster's workers get it in ``PYTHONPATH``, so the
child behaviours and models here load in child processes by reference. Test modules import
from here, never from each other.
"""

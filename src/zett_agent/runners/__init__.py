"""Where children run: runners behind one interface.

``zett_agent.runners.ray.RayRunner`` runs each child as a task on a Ray cluster (the ``ray``
extra). This package never imports Ray; only ``zett_agent.runners.ray`` does.
"""

from __future__ import annotations

__all__: list[str] = []

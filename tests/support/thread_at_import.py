"""A module that starts a thread when it is imported (as some libraries do): preloaded, for
``ProcessPool(warm_up=...)`` tests, the thread is the module's, not the warm-up's."""

from __future__ import annotations

import threading

threading.Thread(target=threading.Event().wait, name="started-at-import", daemon=True).start()

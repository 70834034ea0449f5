"""A module only ``--preload`` imports (the pool tests look for it)."""

from __future__ import annotations

import os

IMPORTED_BY = os.getpid()  # the process that imported it

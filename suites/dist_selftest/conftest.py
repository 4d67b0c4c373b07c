"""The distributed self-test plants its defects in the ``dist`` suite's own model and checks
(``suites/dist/splat_model.py``, ``suites/dist/dist_checks.py``): that folder is put on the
import path next to this one."""

from __future__ import annotations

import sys
from pathlib import Path

DIST_SUITE = Path(__file__).resolve().parent.parent / "dist"
if str(DIST_SUITE) not in sys.path:
    sys.path.insert(0, str(DIST_SUITE))

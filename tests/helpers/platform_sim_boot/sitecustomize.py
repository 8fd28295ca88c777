"""On PYTHONPATH only while a platform simulation runs: every child Python applies it at start."""

import os
import sys

if os.environ.get("PARLEY_SIMULATE_PLATFORM"):
    _root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    if _root not in sys.path:
        sys.path.insert(0, _root)
    from tests.helpers.platform_sim import from_environment

    from_environment()

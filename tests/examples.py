"""How many examples the property tests run.

``make test`` runs every example each test asks for; ``make test-unit`` (the quick loop while
editing) sets ``MESSAGING_TEST_EXAMPLES=0.25`` and runs a quarter of them (never fewer than
five). Hypothesis's own default (tests with no ``max_examples``) is scaled the same way by the
profile ``tests/conftest.py`` loads.
"""

from __future__ import annotations

import os

#: The share of each test's examples to run.
SCALE = float(os.environ.get("MESSAGING_TEST_EXAMPLES", "1"))


def examples(wanted: int) -> int:
    """``wanted`` examples scaled by SCALE (at least 5)."""
    return max(5, round(wanted * SCALE))

"""Every test under tests/e2e/ is end to end: it is marked ``e2e``, so ``-m "not e2e"`` (``make
test-unit``) leaves it out. The shared fixtures stay in tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A conftest's collection hook sees every item of the session, not only this directory's.
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under exactly ``-m "not e2e"`` every test here would be deselected: do not even import
    these modules (Spark, grpc), so that the unit run starts a second sooner."""
    if (config.getoption("markexpr") == "not e2e" and collection_path.is_relative_to(HERE)
            and collection_path.name.startswith("test_")):
        return True
    return None

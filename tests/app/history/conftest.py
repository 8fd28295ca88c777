"""The history tests' fixture: a History in a fresh data folder, closed after the test."""

import pytest

from app.history.history import History


@pytest.fixture
def history(tmp_path):
    h = History(tmp_path / "data")
    yield h
    h.close()

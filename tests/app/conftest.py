"""The window tests' fixtures: `make_window` (a real MainWindow over a real engine with a tiny model,
tests/helpers/window.py) for every test under tests/app."""

from tests.helpers.window import make_window  # noqa: F401  (a fixture: pytest finds it here)

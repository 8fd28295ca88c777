# Parley — two commands: `make run` and `make test`. Both set up .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench setup clean install-desktop uninstall-desktop bundle

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q --upgrade pip
	$(PY) -m pip install --disable-pip-version-check -q -r requirements-dev.txt
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(PY) main.py

test: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q tests

bench: $(STAMP)
	@for b in tests/bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# Linux/BSD desktops: a menu entry + icons for this user, running this checkout's venv.
install-desktop: $(STAMP)
	$(PY) packaging/linux/install_desktop.py install

uninstall-desktop:
	$(PYTHON) packaging/linux/install_desktop.py uninstall

# A one-folder app in dist/Parley (dist/Parley.app on macOS); PyInstaller is installed on demand.
bundle: $(STAMP)
	$(PY) -m pip install --disable-pip-version-check -q "pyinstaller>=6.11"
	$(PY) -m PyInstaller --noconfirm --clean --distpath dist --workpath build packaging/parley.spec

clean:
	rm -rf $(VENV) .pytest_cache

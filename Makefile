# Parley — two commands: `make run` and `make test`. Both set up .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run check test bench bench-report bench-tools setup clean install-desktop uninstall-desktop bundle bundle-check bundle-archive

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q --upgrade pip
	$(PY) -m pip install --disable-pip-version-check -q -r requirements-dev.txt
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(PY) main.py

# Static checks, seconds each once mypy's cache (.mypy_cache) is warm; configuration in pyproject.toml.
FORMAT_CHECK := $(PY) -m ruff format --check .
check: $(STAMP)
	$(PY) -m ruff check .
	$(FORMAT_CHECK)
	$(PY) -m mypy

# Two pytest workers (pytest-xdist), each given whole files so a module's fixtures run once: on a
# 2-core AVX2-only AMD EPYC the suite took 19 min 04 s in one process and 11 min 57 s to 12 min 46 s so
# (measured, five fresh clones)
test: check
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -n 2 --dist loadfile --durations=25 tests

# Every benchmark at full size (minutes each), stopping at the first that fails; then every goal
# line again, together. `make bench BENCH_ARGS=--quick`: all of them small, in seconds each.
bench: SHELL := /bin/bash
bench: $(STAMP)
	@set -o pipefail; log=$$(mktemp); \
	for b in tests/bench/[!_]*.py; do \
		echo "== $$b"; \
		$(PY) -u $$b $(BENCH_ARGS) 2>&1 | tee -a $$log || { echo "== $$b failed"; rm -f $$log; exit 1; }; \
	done; \
	echo "== goals"; grep -E '\(goal .*: (yes|no)\)' $$log; rm -f $$log

# llama.cpp for tests/bench/vs_llamacpp.py and day_of_chats.py (llama-server), built once from the pinned llama-cpp-python sdist into
# ~/.cache/parley-bench (benchmark only; the test suite's quick run skips it where it is not built)
bench-tools: $(STAMP)
	$(PY) tests/bench/_llamacpp.py

# Run the benchmarks (full size unless BENCH_ARGS=--quick; BENCH_ONLY="restore_real image_gate_real"
# for a subset) and write docs/benchmarks.md with a table of every figure, the machine and charts.
bench-report: $(STAMP)
	$(PY) packaging/bench_report.py --bench-args "$(BENCH_ARGS)" $(if $(BENCH_ONLY),--only $(BENCH_ONLY))

# Linux/BSD desktops: a menu entry + icons for this user, running this checkout's venv.
install-desktop: $(STAMP)
	$(PY) packaging/linux/install_desktop.py install

uninstall-desktop:
	$(PYTHON) packaging/linux/install_desktop.py uninstall

# A one-folder app in dist/Parley (dist/Parley.app on macOS), built with PyInstaller from a venv of its
# own kept in ~/.cache/parley-bundle (made on first use, minutes). FLAVOUR=auto (default: cuda where an
# NVIDIA GPU is present, else cpu) | cpu (torch without CUDA) | cuda. See packaging/bundle.py.
FLAVOUR ?= auto
bundle:
	$(PYTHON) packaging/bundle.py build --flavour $(FLAVOUR)

# The bundle, built or reused when its inputs are unchanged, runs `parley --self-check` offscreen.
bundle-check:
	$(PYTHON) packaging/bundle.py check --flavour $(FLAVOUR)

# Linux: dist/Parley-<version>-linux-<arch>-<flavour>.tar.gz (unpack, run Parley/parley;
# `python3 Parley/install-desktop.py install` adds the menu entry and icons).
bundle-archive:
	$(PYTHON) packaging/bundle.py archive --flavour $(FLAVOUR)

clean:
	rm -rf $(VENV) .pytest_cache

# Thin targets (ARCHITECTURE.md §1). Each target sets itself up in a local virtual environment,
# installing only what it needs, at the versions requirements.lock pins:
#   make book                         the book's tools alone (the `book` extra; no torch)
#   make lab, reproduce, sweep        the library, editable, with its `lab` extra
#   make bench                        the library with the `bench` extra (the benchmarks' peers)
#   make test                         everything (the `test` extra), ruff, and Debian's Chromium
# On a machine without an NVIDIA GPU torch is the CPU build: the CUDA wheels are never pulled.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOCK := requirements.lock
PIP := $(PY) -m pip install --quiet --constraint $(LOCK)
TORCH_VERSION ?= 2.13.0
AS_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo yes)
SUDO := $(if $(AS_ROOT),,sudo)

.PHONY: setup book serve test lint lab reproduce bench sweep browser lock clean

setup: $(VENV)/.installed-test

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch first, so that the package's torch>=2.4 is already met and pulls no CUDA wheels on a CPU
# machine. The lock leaves torch out (its build depends on the machine); TORCH_VERSION pins it.
# Without an NVIDIA GPU (and not on macOS): the CPU build, from wherever pip's own configuration
# points (an index or find-links) or else from PyTorch's CPU index (this needs the internet).
$(VENV)/.torch: $(LOCK) | $(PY)
	@if nvidia-smi -L >/dev/null 2>&1 || [ "$$(uname)" = Darwin ]; then \
	    $(PIP) "torch==$(TORCH_VERSION)"; \
	elif ! $(PIP) "torch==$(TORCH_VERSION)+cpu" 2>/dev/null; then \
	    echo "torch==$(TORCH_VERSION)+cpu: from PyTorch's CPU index"; \
	    $(PIP) --extra-index-url https://download.pytorch.org/whl/cpu "torch==$(TORCH_VERSION)+cpu"; \
	fi
	@touch $@

# The requirements of one extra of pyproject.toml, one a line (`python -c "$$EXTRA" book`).
define EXTRA
import sys
try:
    import tomllib
except ImportError:  # Python 3.10: the copy of tomli that pip carries
    from pip._vendor import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    print(*tomllib.load(f)["project"]["optional-dependencies"][sys.argv[1]], sep="\n")
endef
export EXTRA

# The book is built from the committed notebooks without running them: its tools alone.
$(VENV)/.installed-book: pyproject.toml $(LOCK) | $(PY)
	$(PY) -c "$$EXTRA" book > $(VENV)/book-requirements.txt
	$(PIP) --requirement $(VENV)/book-requirements.txt
	@touch $@

# The package in editable mode with the extra the file's name gives (lab, bench, test).
$(VENV)/.installed-%: pyproject.toml $(LOCK) $(VENV)/.torch
	$(PIP) --editable ".[$*]"
	@touch $@

browser:
	@command -v chromium >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }

book: $(VENV)/.installed-book
	$(VENV)/bin/jupyter-book build .
	@echo "open _build/html/index.html, or: make serve"

# The built book over HTTP on this machine only (search and the explorers work as they do online).
PORT ?= 8000
serve: book
	@echo "serving the book at http://127.0.0.1:$(PORT)/ (Ctrl-C stops)"
	$(PY) -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .

test: $(VENV)/.installed-test browser lint
	$(PY) -m pytest

# JupyterLab refuses to start as root unless told: containers often run as root.
lab: $(VENV)/.installed-lab
	$(VENV)/bin/jupyter lab notebooks $(if $(AS_ROOT),--allow-root)

reproduce: $(VENV)/.installed-lab $(VENV)/.installed-book
	$(PY) scripts/reproduce.py --scale auto --out _build/runs

# QUICK=1: a smoke check of every benchmark script (tiny model, few tokens; under a minute
# on a CPU).
bench: $(VENV)/.installed-bench
	$(PY) benchmarks/run_all.py $(if $(QUICK),--quick)

# Re-run one chapter over a grid of its parameters, e.g.
#   make sweep NB=notebooks/08_sft.ipynb ARGS="-p seed 0 1 2 --scale smoke"
sweep: $(VENV)/.installed-lab
	$(PY) scripts/sweep.py $(NB) $(ARGS)

# Re-resolve requirements.lock after a change to pyproject.toml, keeping the other pins (UPGRADE=1:
# the newest versions that fit). torch stays out of the file (TORCH_VERSION pins it). uv does it,
# installed in a throwaway virtual environment.
lock:
	rm -rf _build/lock && $(PYTHON) -m venv _build/lock && _build/lock/bin/pip install --quiet uv
	echo "torch==$(TORCH_VERSION)" > _build/lock/torch.txt
	_build/lock/bin/uv pip compile pyproject.toml --extra lab --extra book --extra bench --extra test \
	    --universal --python-version 3.10 --constraint _build/lock/torch.txt --no-emit-package torch \
	    --custom-compile-command "make lock" $(if $(UPGRADE),--upgrade) --output-file $(LOCK)
	rm -rf _build/lock

clean:
	rm -rf _build

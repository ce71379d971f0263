# One entry point for building, linting, testing and benchmarking svc. `make help` lists targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
export CARGO_TARGET_DIR ?= $(HOME)/.cache/svc-target

.PHONY: help
help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-10s %s\n", $$1, $$2}'

$(BIN)/python:
	@command -v $(PY) >/dev/null || { echo "need $(PY) on PATH"; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

.PHONY: setup
setup: $(BIN)/python ## Create .venv with maturin (the build front end)
	$(BIN)/pip install -q "maturin>=1.9,<2"

PROTO_OUT := python/svc/authz/v1

.PHONY: build
build: setup ## Build svc (Rust extension in release) into .venv with the dev extras of pyproject.toml
	$(BIN)/maturin develop --release -q --extras dev
	$(MAKE) --no-print-directory proto
	$(MAKE) --no-print-directory web

.PHONY: proto
proto: ## Generate the Python gRPC stubs from proto/ (grpcio-tools; Rust's come from build.rs)
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=python --pyi_out=python \
		--grpc_python_out=python proto/svc/authz/v1/authz.proto proto/svc/policy/v1/policy.proto \
		proto/svc/challenge/v1/challenge.proto

# The portal's web app (web/portal, docs/portal.md#the-web-app): npm ci (the npm cache is
# reused; skipped while node_modules matches package-lock.json) and vite build on Node 22 from
# scripts/dev-node.sh, into python/svc/portal/static/ (not in git; the wheel carries it).
NODE_PATH_PREFIX = PATH="$$(dirname "$$($(CURDIR)/scripts/dev-node.sh node)"):$$PATH"

web/portal/node_modules/.package-lock.json: web/portal/package-lock.json web/portal/package.json
	scripts/dev-node.sh node >/dev/null 2>&1 || scripts/dev-node.sh install
	cd web/portal && $(NODE_PATH_PREFIX) npm ci --no-audit --no-fund --prefer-offline

.PHONY: web
web: web/portal/node_modules/.package-lock.json ## Build the portal's web app into python/svc/portal/static
	cd web/portal && $(NODE_PATH_PREFIX) npm run --silent build

.PHONY: wheel
wheel: setup ## Build the release wheel and sdist into dist/ (pip install dist/svc-*.whl)
	$(BIN)/pip install -q "grpcio-tools>=1.60"
	$(MAKE) --no-print-directory proto
	$(MAKE) --no-print-directory web
	$(BIN)/maturin build --release --sdist -o dist

.PHONY: run
run: build ## Set up and run the main job: svc up (decision point :8080, intake :8081, history :8082)
	$(BIN)/svc up

.PHONY: demo
demo: build ## svc demo: the demo company's traffic through svc up, then its summary from history
	$(BIN)/svc demo

.PHONY: lint
lint: build ## rustfmt, clippy -D warnings, ruff, mypy and stubtest on the extension
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(BIN)/ruff check python tests benches
	$(BIN)/ruff format --check python tests benches
	$(BIN)/mypy
	$(BIN)/python -m mypy.stubtest svc._pdp_core

.PHONY: test
test: lint ## Set up, lint, and run cargo test and pytest
	cargo test --workspace
	$(BIN)/pytest -q tests

.PHONY: screenshots
screenshots: build ## Refresh docs/images/ from the challenge page's and the portal's tests in Chromium (tests only compare)
	SVC_REFRESH_SCREENSHOTS=1 $(BIN)/pytest -q tests/test_challenge_page.py tests/test_portal_web.py

.PHONY: bench
bench: build ## Criterion bench of decide, then the Python benches (evaluate, plan) against cedarpy
	cargo bench -p pdp_core --bench decide
	$(BIN)/python benches/bench_evaluate.py
	$(BIN)/python benches/bench_plan.py

.PHONY: load-bench
load-bench: build ## Load bench: svc pdp vs its no-op ceiling and Cerbos, pinned cores (LOAD_ARGS=--quick)
	bash benches/load/setup.sh
	$(BIN)/python benches/load/run.py $(LOAD_ARGS)

.PHONY: log-bench
log-bench: build ## Decision log under load: window vs durable mode, with Kafka (LOG_ARGS=--rounds 3)
	command -v wrk >/dev/null || bash benches/load/setup.sh
	$(BIN)/python benches/load/decision_log.py $(LOG_ARGS)

.PHONY: clean
clean: ## Remove the virtualenv and Python caches (the cargo target dir is kept)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

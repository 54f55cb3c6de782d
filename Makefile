# `make test` runs every check and test; `make bench` the benchmarks. Everything else is plumbing.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv native mcp-servers js-client js-test native-test services browser test test-kafka test-cluster lint typecheck unit bench demo clean reference-skeleton

# Real MCP servers from npm that the tests start (the PyPI ones come with the dev extra): installed from the
# lockfile into tests/servers/node_modules (git-ignored), pinned.
NODE_SERVERS := tests/servers
# The JavaScript producer (clients/js, its own package): installed from its lockfile (node and npm from
# Debian's packages when missing and this is root), its node tests run by `make test`. Node is needed where
# CI is set; elsewhere its absence is said and its tests are skipped.
JS_CLIENT := clients/js
NATIVE_SOURCES := native/Cargo.toml native/Cargo.lock native/pyproject.toml native/src/lib.rs native/src/jcs.rs native/preflight_audit_native.pyi

$(STAMP): pyproject.toml $(NATIVE_SOURCES) $(NODE_SERVERS)/package-lock.json $(JS_CLIENT)/package-lock.json
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(MAKE) --no-print-directory native
	$(MAKE) --no-print-directory mcp-servers
	$(MAKE) --no-print-directory js-client
	touch $(STAMP)

venv: $(STAMP)

# The projector's compiled check (native/, Rust): built and installed wherever cargo is; without it the
# projector runs the same check in Python, more slowly (projections/README.md). On CI (CI set) a missing
# toolchain fails the build: its tests must run there.
native:
	@if command -v cargo >/dev/null 2>&1; then \
		$(BIN)/python -m pip install --quiet ./native; \
	elif [ -n "$$CI" ]; then \
		echo "no Rust toolchain (cargo) on CI: the compiled check must be built and tested there (rustup.rs)" >&2; \
		exit 1; \
	else \
		echo "no Rust toolchain (cargo): the projector checks canonical events in Python" >&2; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy .

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit tests/contract

# The compiled check's own tests (Rust), where there is a Rust toolchain.
mcp-servers:
	@if command -v npm >/dev/null 2>&1; then \
		npm ci --prefix $(NODE_SERVERS) --no-audit --no-fund --loglevel=error; \
	else \
		echo "no node/npm: the tests against the npm filesystem MCP server are skipped" >&2; \
	fi

js-client:
	@if ! command -v npm >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; \
	fi
	@if command -v npm >/dev/null 2>&1; then \
		npm ci --prefix $(JS_CLIENT) --no-audit --no-fund --loglevel=error; \
	elif [ -n "$$CI" ]; then \
		echo "no node/npm on CI: the JavaScript producer (clients/js) needs them" >&2; exit 1; \
	else \
		echo "no node/npm: the JavaScript producer (clients/js) is not installed and its tests are skipped" >&2; \
	fi

# The JavaScript producer's own tests (node's test runner).
js-test: $(STAMP)
	@if command -v node >/dev/null 2>&1; then \
		cd $(JS_CLIENT) && node --test; \
	elif [ -n "$$CI" ]; then \
		echo "no node on CI: the JavaScript producer's tests (clients/js) cannot run" >&2; exit 1; \
	fi

native-test: $(STAMP)
	@if command -v cargo >/dev/null 2>&1; then \
		cargo fmt --check --manifest-path native/Cargo.toml && \
		PYO3_PYTHON=$(abspath $(BIN))/python cargo test --quiet --release --manifest-path native/Cargo.toml; \
	fi

# System packages the tests start for real: a PostgreSQL server (the replay store engines on several hosts
# share, `preflight.adapters.replay_postgres`). Installed from Debian's packages when missing (as root).
services:
	@if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; \
		else \
			echo "no PostgreSQL server: install Debian's postgresql package (as root: make services)" >&2; exit 1; \
		fi; \
	fi

# Debian's Chromium, for the console's browser tests (tests/integration/test_console.py, driven by Playwright
# through its executable): installed when missing and this is root on a Debian machine; otherwise those tests
# are skipped and say why (on CI, where CI is set, they fail instead).
browser:
	@if ! command -v chromium >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else \
			echo "chromium is not installed and this is not root: the console's browser tests will be skipped" >&2; \
		fi; \
	fi

# The whole suite: lint, types, then every test (unit, contract, integration on the selected broker).
test: lint typecheck native-test js-test services browser
	$(BIN)/pytest -q -m "not cluster"; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The integration suite again, on an Apache Kafka broker assembled from Maven Central (CI tier).
test-kafka: $(STAMP) services browser
	PREFLIGHT_BROKER=kafka $(BIN)/pytest -q -m integration; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# Three Apache Kafka brokers (KRaft, replication factor 3, min.insync.replicas 2) that lose two nodes
# mid-stream: nothing acknowledged is lost or repeated (tests/reliability/test_broker_loss.py; a few minutes).
test-cluster: $(STAMP) services
	$(BIN)/pytest -q -m cluster tests/reliability; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The whole system once on this machine: broker, worker, projector, agent sessions, the audit (see README).
demo: $(STAMP)
	$(BIN)/preflight-audit demo

# The reliability suite (tests/reliability) as a soak: 50 kill cycles per fault test instead of CI's 20,
# on the selected broker (PREFLIGHT_BROKER=kafka adds the broker restarts). PREFLIGHT_FAULT_SEED replays one.
soak: $(STAMP)
	PREFLIGHT_SOAK_CYCLES=$${PREFLIGHT_SOAK_CYCLES:-50} $(BIN)/pytest -q -m reliability tests/reliability; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

bench: $(STAMP)
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/fold.py
	$(BIN)/python bench/verdict.py
	$(BIN)/python bench/scale_out.py
	$(BIN)/python bench/worker_start.py
	$(BIN)/python bench/projector.py
	$(BIN)/python bench/lookup_runs.py
	$(BIN)/python bench/freshness.py
	$(BIN)/python bench/archive_queries.py
	$(BIN)/python bench/console_page.py
	$(BIN)/python bench/verify.py
	$(BIN)/python bench/gateway_latency.py --floor
	$(BIN)/python bench/upstream_session.py
	$(BIN)/python bench/lake.py

# The public JavaScript reference skeleton that bench/engine.py compares with (never part of the project):
# its one file at a pinned commit, copied into bench/.cache (git-ignored) from SKELETON_FROM -- a URL
# (fetched with curl) or a path to a copy you have -- and checked against its SHA-256.
SKELETON_COMMIT := 381ade8f5b485143ade5fb1a624a26e30dfa22c7
SKELETON_SHA256 := 736d7ab003ad78d077b9e12abf4ecdb58b5723ae8860cc728206fbffc0f470a7
SKELETON_FROM ?= https://raw.githubusercontent.com/Jang-woo-AnnaSoft/execution-state-preflight/$(SKELETON_COMMIT)/execution-state-preflight.js
SKELETON_FILE := bench/.cache/execution-state-preflight.js
reference-skeleton:
	mkdir -p bench/.cache
	case "$(SKELETON_FROM)" in http*) curl -fsSL "$(SKELETON_FROM)" -o $(SKELETON_FILE).tmp ;; *) cp "$(SKELETON_FROM)" $(SKELETON_FILE).tmp ;; esac
	echo "$(SKELETON_SHA256)  $(SKELETON_FILE).tmp" | sha256sum -c --quiet - || { rm -f $(SKELETON_FILE).tmp; exit 1; }
	mv $(SKELETON_FILE).tmp $(SKELETON_FILE)

clean:
	rm -rf $(VENV) $(NODE_SERVERS)/node_modules $(JS_CLIENT)/node_modules .mypy_cache .ruff_cache .pytest_cache build *.egg-info native/target

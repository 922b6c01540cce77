# wsfleet: `make demo` runs the fleet on this machine; `make test` runs every test.
# Both set themselves up: a venv in .venv (pinned requirements) and, for the CDK CLI,
# node_modules (package-lock.json).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CDK := node_modules/.bin/cdk
# One per file in environments/ (a new file is a new environment, synthesized and linted too).
ENVS := $(sort $(basename $(notdir $(wildcard environments/*.toml))))
# libfaketime: the fleet test of workers whose wall clocks disagree, and the chaos soak's
# clock faults, run workers under it.
FAKETIME_LIB := /usr/lib/$(shell uname -m)-linux-gnu/faketime/libfaketime.so.1
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

export PYTHONPATH := $(CURDIR)/runtime:$(CURDIR)
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# The venv is installed without byte-compiling: pip compiles every file of every package,
# 45 s on one core here, two thirds of it aws-cdk-lib, most of which is never imported.
# Python compiles what is imported, once, which it can only keep if it may write caches.
unexport PYTHONDONTWRITEBYTECODE
# Node 20 is older than jsii likes; the banner is noise, not a problem.
export JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_KNOWN_BROKEN_NODE_VERSION := 1
# For an end-of-life Node, jsii wants the major versions to keep quiet about.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_DISABLE_VERSION_CHECK := 1

.PHONY: all demo chaos test check setup lint synth cfnlint bench bench-smoke venv faketime clean

all: test

# make demo, chaos and bench need the fleet's set only (requirements-demo.txt: no CDK, no
# test tools); make test and check the whole of requirements-dev.txt, which includes it
# (so installing that one stamps both).
DEMO_DEPS := $(VENV)/.demo-deps
$(DEMO_DEPS): requirements-demo.txt runtime/requirements.txt runtime/requirements-cli.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile -r requirements-demo.txt
	touch $@

$(VENV)/.deps: requirements.txt requirements-dev.txt requirements-demo.txt runtime/requirements.txt runtime/requirements-cli.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile -r requirements-dev.txt
	touch $@ $(DEMO_DEPS)

node_modules/.deps: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

venv: $(VENV)/.deps

# Debian's faketime package, installed once if it is missing (apt-get; root or sudo). Where
# there is no apt-get, the one test that needs it is skipped, with this warning.
$(FAKETIME_LIB):
	@if ! command -v apt-get >/dev/null; then \
	  echo "warning: no libfaketime (Debian: faketime): the clock-skew fleet test will be skipped" >&2; \
	else \
	  echo "apt-get install faketime"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null \
	  || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null; }; \
	fi

faketime: $(FAKETIME_LIB)

# What make test needs, installed side by side (pip, npm and apt-get mostly wait on the network).
setup:
	@$(MAKE) --no-print-directory -j3 $(VENV)/.deps node_modules/.deps $(FAKETIME_LIB)

## demo: the whole fleet on this machine (embedded default), with a failover scenario;
## SINK=kinesis (or dynamodb,kinesis) sends the frames to a Kinesis stream and audits it;
## TRACING=otel writes every process's spans to the run directory (python -m sim.traces).
demo: $(DEMO_DEPS)
	$(PY) -m sim.demo $(if $(SINK),--sink $(SINK)) $(if $(TRACING),--tracing $(TRACING)) $(DEMO_ARGS)

## chaos: seeded random faults against the whole fleet, then an audit of the invariants
## from independent evidence; exit 1 on any violation, with the command that replays it.
## SEED (random if unset, printed), MINUTES of chaos, WORKERS, CONNECTIONS, SINK (as for
## demo; with kinesis the stream is audited and Kinesis faults are dealt); CHAOS_ARGS
## for the rest (python -m sim.chaos --help).
MINUTES ?= 10
WORKERS ?= 4
CONNECTIONS ?= 40
chaos: $(DEMO_DEPS) $(FAKETIME_LIB)
	$(PY) -m sim.chaos $(if $(SEED),--seed $(SEED)) --minutes $(MINUTES) --workers $(WORKERS) \
	  --connections $(CONNECTIONS) $(if $(SINK),--sink $(SINK)) $(CHAOS_ARGS)

## test: lint, unit, emulator, fleet and stack tests, then `cdk synth` of every environment
## and cfn-lint over the templates it writes; the 15 slowest tests are listed at the end.
## TEST_WORKERS pytest-xdist workers (more than the cores: most fleet tests wait on leases
## and handoffs rather than compute); PYTEST_ARGS for the rest.
## `make cfnlint` runs beside pytest, where the fleet tests leave the cores idle while
## they wait, at a lower priority so as not to slow the tests that measure time; its
## output is printed after pytest's.
TEST_WORKERS ?= 4
test: setup lint
	@log=$$(mktemp); \
	echo "nice make cfnlint > $$log &"; nice -n 10 $(MAKE) --no-print-directory cfnlint > $$log 2>&1 & cfnlint=$$!; \
	echo "$(PY) -m pytest -n $(TEST_WORKERS) -m 'not bench_smoke' --durations=15 $(PYTEST_ARGS)"; \
	$(PY) -m pytest -n $(TEST_WORKERS) -m 'not bench_smoke' --durations=15 $(PYTEST_ARGS); tests=$$?; \
	wait $$cfnlint; linted=$$?; cat $$log; rm -f $$log; \
	if [ $$linted -ne 0 ]; then echo "make cfnlint failed" >&2; fi; \
	exit $$(( tests || linted ))

## bench-smoke: every benchmark run end to end at tiny size (`python -m bench NAME --quick`,
## tests/test_bench.py), that each still runs and writes its table and JSON; CI runs it
## after `make test`, which leaves these out (together they took as long as the rest).
bench-smoke: $(DEMO_DEPS)
	$(PY) -m pytest -n $(TEST_WORKERS) -m bench_smoke --durations=5 $(PYTEST_ARGS)

## check: the inner loop, under a minute: lint, then every test that is not slow (unit,
## emulator and stack snapshot tests; no process started, no worker run: tests/markers.py)
check: $(VENV)/.deps lint
	$(PY) -m pytest -n 2 -m "not slow" --durations=5 $(PYTEST_ARGS)

## lint: ruff (pyflakes, bugbear; ruff.toml)
lint: $(VENV)/.deps
	$(VENV)/bin/ruff check .

## synth: `cdk synth` of every environment through the real aws-cdk CLI, side by side
synth: $(VENV)/.deps node_modules/.deps
	@pids=; for env in $(ENVS); do \
	  echo "cdk synth -c env=$$env"; \
	  $(CDK) synth -c env=$$env --output cdk.out/$$env --quiet & pids="$$pids $$!"; \
	done; \
	failed=0; for pid in $$pids; do wait $$pid || failed=1; done; exit $$failed

## cfnlint: `make synth`, then cfn-lint over every template it wrote: no error, no warning
## but the rules .cfnlintrc ignores (each with its reason)
cfnlint: synth
	$(VENV)/bin/cfn-lint $(foreach env,$(ENVS),cdk.out/$(env)/*.template.json)

## bench: failover, cost (and fleet scaling), capacity, ingestion, sinks (table against stream), faults, rebalance, pauses, large-frame memory, amplification, hostile-peer benchmarks and the virtual-time simulator at 2,000 workers (figures to stdout)
bench: $(DEMO_DEPS)
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) node_modules cdk.out .pytest_cache

# Two commands on a fresh machine:
#   make chaos   — set everything up, run the chaos suites on the embedded cluster
#   make test    — set everything up, run the harness's own tests (CI runs both)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PYTEST := $(PY) -m pytest
ALLURE := reports/allure-results

.PHONY: setup chaos test lint report clean

setup: $(VENV)/.installed node_modules/.installed .system-packages

# constraints.txt pins the default Ray inside pyproject.toml's supported range (docs/ray-versions.md).
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[workload,frameworks,dev]'
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

.system-packages: scripts/setup-system.sh
	bash scripts/setup-system.sh
	touch $@

# The tiers (docs/testing.md has what each covers):
#   make test         seconds-to-minutes, starts no Ray: unit, contract (real runs' tapes
#                     replayed), emulated Kubernetes API with the real kubectl, shim, test
#                     hosts, report.  What to run on every change.
#   make chaos        the chaos suites on the embedded clusters: every catalog fault kind and
#                     budget class once (suites marked `extended` are left to make
#                     integration) and a short seeded campaign (the soak suite, --chaos-duration
#                     $(CHAOS_SOAK)) in one session, then the README's own-script command as a
#                     user runs it.
#   make wheel-test   the installed wheel from outside a cluster it did not start (CI runs it
#                     after make chaos: packaging, not the embedded cluster).
#   make integration  the rest on real clusters (not in CI): extended suites, user and
#                     framework scripts in their own sessions, profile stand-ins, SIGTERM/
#                     SIGKILL + sweep sessions; re-records tests/contract/fixtures.
# One session per pytest command: the embedded cluster, and for the kubernetes-marked suites
# the embedded Kubernetes cluster (one at a time).  JOBS=N spreads the suite files over N
# pytest-xdist workers, each with its own clusters, in the files' order (the foreign stand-in
# first); their cluster starts take turns (one_start_at_a_time: on 2 cores two starts at once
# can miss Ray's fixed wait for the dashboard agent).  "No tests selected" (exit 5, e.g. with
# ARGS="-k ...") is not a failure.
# Two workers: a suite's run keeps about 1.2 of 2 cores busy (bench/bench_run_cost.py), the
# rest is waiting on Ray's health checks and restarts; cluster starts take turns.
JOBS ?= 2
# make chaos's campaign: 180 s is the shortest run two faults fit into.
CHAOS_SOAK ?= 180
XDIST = $(if $(filter-out 1,$(1)),-n $(1) --dist loadfile)
XDIST_SUITES = $(if $(filter-out 1,$(1)),-n $(1) --dist loadfile --no-loadscope-reorder)
chaos: setup
	$(PYTEST) -m "(chaos and not extended) or soak" suites --chaos-duration $(CHAOS_SOAK) \
	  $(call XDIST_SUITES,$(JOBS)) --alluredir $(ALLURE) -p no:cacheprovider -rA --durations=0 $(ARGS) \
	  || [ $$? -eq 5 ]
	$(MAKE) --no-print-directory own-script

# The README's "Your own training script" command, literally (a test checks they agree).
own-script: setup
	.venv/bin/pytest -m chaos suites/test_raylet_kill.py::test_raylet_kill_with_spare_capacity --chaos-workload "python my_train.py" --chaos-workload-dir examples/workloads --alluredir $(ALLURE)

# The harness as a team installs it (tests/wheel): the wheel built from a fresh copy of the
# checkout, installed into a new virtualenv (dependencies from pip's index and cache), run by a
# runner that cannot see the checkout against the foreign-cluster stand-in, then the report.
wheel-test: setup
	$(PYTEST) -m integration tests/wheel -p no:cacheprovider -rA

# The seeded fault campaign (suites/test_campaign.py, marker soak; make chaos ends with a short one):
# one run of about DURATION seconds through a schedule drawn from --chaos-seed, e.g.
#   make soak DURATION=600 ARGS="--chaos-seed 7"
#   make soak ARGS="--chaos-schedule reports/runs/test_campaign/schedule.json"   (replay)
DURATION ?= 240
.PHONY: soak own-script wheel-test integration integration-scripts integration-sessions integration-suites
soak: setup
	$(PYTEST) -m soak suites --chaos-duration $(DURATION) --alluredir $(ALLURE) -p no:cacheprovider -rA $(ARGS)

# Starts no Ray (tests/conftest.py refuses a cluster start outside integration tests), so
# two xdist workers by default; TEST_JOBS=1 for one process.
TEST_JOBS ?= 2
test: setup lint
	$(PYTEST) tests -m "not integration" $(call XDIST,$(TEST_JOBS)) -p no:cacheprovider -rfEs --durations=15 $(ARGS)

# ruff over the tree, mypy --strict over chaos/verdicts (pyproject.toml says which rules and why).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Three named parts, each its own pytest command over INTEGRATION_JOBS xdist workers (2: the
# sessions are mostly waiting on Ray; their cluster starts take turns), each under 40 min on
# 2 cores (the tier holds about 90 min of real runs there; docs/development.md):
#   make integration-scripts   user and framework scripts, each with its bugs, the elastic session
#                              and the profile sessions (dry run, lock, SIGTERM/SIGKILL + sweep) —
#                              chaos sessions of their own on a shared stand-in
#   make integration-sessions  the resume shapes, the adoption paths (doctor, sudo, recipes, the
#                              documented commands), the embedded cluster's command line
#   make integration-suites    the extended suites, the foreign-cluster stand-in's families among them
# The first two re-record tests/contract/fixtures.  make -k integration runs all three whatever fails.
INTEGRATION_JOBS ?= 2
INTEGRATION_SCRIPTS = tests/integration/test_user_workloads.py tests/integration/test_framework_workloads.py \
  tests/integration/test_elastic_session.py tests/integration/test_profiles.py
INTEGRATION_ARGS = -m integration $(if $(filter-out 1,$(INTEGRATION_JOBS)),-n $(INTEGRATION_JOBS) --dist worksteal) \
  -p no:cacheprovider -rfEs --durations=0 $(ARGS)
integration: integration-scripts integration-sessions integration-suites
integration-scripts: setup
	CHAOS_CONTRACT_DIR=tests/contract/fixtures $(PYTEST) $(INTEGRATION_SCRIPTS) $(INTEGRATION_ARGS)
integration-sessions: setup
	CHAOS_CONTRACT_DIR=tests/contract/fixtures $(PYTEST) tests --ignore=tests/wheel \
	  $(addprefix --ignore=,$(INTEGRATION_SCRIPTS)) $(INTEGRATION_ARGS)
integration-suites: setup
	$(PYTEST) -m "chaos and extended" suites $(call XDIST_SUITES,$(INTEGRATION_JOBS)) --alluredir $(ALLURE) \
	  -p no:cacheprovider -rA --durations=0 $(ARGS) || [ $$? -eq 5 ]

report: setup
	$(PY) -m chaos.allure_site

# The upgrade canary (docs/ray-versions.md; scripts/canary.sh): make canary RAY=2.59.0 runs
# SUITES with -m chaos on the default Ray (.venv; its session is reused while suites, Ray and
# harness are unchanged, FRESH=1 reruns it) and on RAY (.venv-canary/RAY, built once per
# version), then writes the behaviour-difference table to stdout and
# reports/canary/RAY-vs-<default>.md.  A RAY outside chaos/ray_support.py's range is refused
# before anything is built.  The default SUITES: one suite per budget class and fault family.
CANARY_SUITES := suites/test_raylet_kill.py::test_raylet_kill_with_spare_capacity \
  suites/test_preemption.py::test_preemption_with_spare_capacity_is_charged_to_the_preemption_budget \
  suites/test_cuda_faults.py::test_ecc_error_in_rank_1_after_checkpoint_2 \
  suites/test_raylet_kill.py::test_replacement_slower_than_the_worker_group_start_timeout
SUITES ?= $(CANARY_SUITES)
.PHONY: canary
canary:
	@[ -n "$(RAY)" ] || { echo "usage: make canary RAY=<version> [SUITES=...] [ARGS=...] [FRESH=1]" >&2; exit 2; }
	bash scripts/canary.sh check '$(RAY)'
	$(MAKE) --no-print-directory setup .venv-canary/$(RAY)/.installed
	FRESH='$(FRESH)' bash scripts/canary.sh run '$(RAY)' $(SUITES) -- $(ARGS)

# One venv per canary Ray: make setup's install with constraints.txt's Ray pin replaced by it.
.venv-canary/%/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv .venv-canary/$*
	.venv-canary/$*/bin/python -m pip install -q --upgrade pip
	{ echo '# generated by make canary from constraints.txt, with Ray $*'; grep -v '^ray==' constraints.txt; \
	  echo 'ray==$*'; } > .venv-canary/$*/constraints.txt
	.venv-canary/$*/bin/python -m pip install -q -c .venv-canary/$*/constraints.txt -e '.[workload,frameworks]' \
	  'ray[train,default]==$*'
	touch $@

clean:
	rm -rf reports/allure-results reports/allure-report reports/runs reports/embedded reports/storage reports/summary.d

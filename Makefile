# Two commands on a fresh machine:
#   make chaos   — set everything up, run the chaos suites on the embedded cluster
#   make test    — set everything up, run the harness's own tests (what CI runs)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PYTEST := $(PY) -m pytest
ALLURE := reports/allure-results

.PHONY: setup chaos test report clean

setup: $(VENV)/.installed node_modules/.installed .system-packages

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[workload,frameworks]'
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

.system-packages: scripts/setup-system.sh
	bash scripts/setup-system.sh
	touch $@

# One session: the embedded cluster, and for the kubernetes-marked suites the embedded
# Kubernetes cluster (one at a time).  JOBS=N spreads the suite files over N pytest-xdist
# workers, each with its own clusters — for machines with cores to spare (2 cores: 22 min
# with two workers, 25 with one, and cluster starts under that load can miss Ray's fixed
# wait for the dashboard agent; README).  "No tests selected" (exit 5, e.g. with
# ARGS="-k ...") is not a failure.
JOBS ?= 1
chaos: setup
	$(PYTEST) -m chaos suites $(if $(filter-out 1,$(JOBS)),-n $(JOBS) --dist loadfile) --alluredir $(ALLURE) \
	  -p no:cacheprovider -rA --durations=0 $(ARGS) || [ $$? -eq 5 ]

# The seeded fault campaign (suites/test_campaign.py, marker soak; never part of make chaos):
# one run of about DURATION seconds through a schedule drawn from --chaos-seed, e.g.
#   make soak DURATION=600 ARGS="--chaos-seed 7"
#   make soak ARGS="--chaos-schedule reports/runs/test_campaign/schedule.json"   (replay)
DURATION ?= 240
.PHONY: soak
soak: setup
	$(PYTEST) -m soak suites --chaos-duration $(DURATION) --alluredir $(ALLURE) -p no:cacheprovider -rA $(ARGS)

# TEST_JOBS=N: N pytest-xdist workers, a test file each at a time (every cluster claims its
# own slot, so they can run side by side); one by default, for the reason JOBS is.
TEST_JOBS ?= 1
test: setup
	$(PYTEST) tests $(if $(filter-out 1,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadfile) -p no:cacheprovider -rfEs \
	  --durations=15 $(ARGS)

report: setup
	$(PY) -m chaos.allure_site

clean:
	rm -rf reports/allure-results reports/allure-report reports/runs reports/embedded reports/storage reports/summary.d

# atlas-serving: provisioning and rollout of LLM serving on Huawei Atlas (Ascend 910B) fleets.
# Quick start on a fresh Debian 12 machine (root): `make demo`, then `make test`. `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
VENV := .venv
PY := $(VENV)/bin/python
ATLASCTL := $(VENV)/bin/atlasctl
LAB := $(VENV)/bin/atlas-lab
RUFF := $(VENV)/bin/ruff check tools tests collections
YAMLLINT := $(VENV)/bin/yamllint -s .
ANSIBLE_LINT := $(VENV)/bin/ansible-lint --offline -q
IMPORT_CONTRACTS := $(VENV)/bin/lint-imports --no-cache
# ansible-test sanity on the collection, from the venv with a private HOME (tests/ansible_test_sanity.py)
SANITY := $(PY) tests/ansible_test_sanity.py
# The tiers by what they run: tests/unit pure Python (no playbook run), tests/role the roles and playbooks through
# ansible-playbook on this machine (the slow ones: ci-slow), tests/lab the lab (the ci_lab ones: ci-lab).
UNIT_TESTS := $(VENV)/bin/pytest -ra tests/unit
ROLE_TESTS := $(VENV)/bin/pytest -ra -m "not slow" tests/role
SLOW_TESTS := $(VENV)/bin/pytest -ra -m slow tests/role
LAB_TESTS := $(VENV)/bin/pytest -ra -m "not ci_lab" tests/lab
HOST_PACKAGES := debootstrap systemd-container nftables zstd openssh-client iproute2 rsync curl gnupg gpgv
# Programs the tests run, taken out of Debian packages into the venv's bin/ (tests/deb_tool.sh), so the host gets
# the tool and no service or configuration: promtool and prometheus (package prometheus) for the monitoring tests
# (`promtool check rules`, `promtool test rules`, the role's files loaded by a short-lived Prometheus), nginx
# (package nginx) for `nginx -t` of the gateway's site (tests/unit/collection/test_gateway_door.py).
DEB_TOOLS := $(VENV)/bin/promtool $(VENV)/bin/prometheus $(VENV)/bin/nginx
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export PYTHONUNBUFFERED := 1

.PHONY: help demo test unit role lint lab-test drills ci-drills ci-lab ci-slow wheel host-deps venv lab-up lab-down bundle site \
	bench-verify bench-client bench-rollout bench-stage bench-wheelhouse clean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z-]*:.*## / {printf "  %-17s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

demo: host-deps venv ## host packages, venv, the lab, its offline bundle, site.yml on the lab, the fleet table
	$(LAB) up
	$(LAB) bundle
	$(VENV)/bin/ansible-playbook -i inventory/lab site.yml
	$(ATLASCTL) health -i inventory/lab

# The lab tests in the foreground; beside them, in make's session at the lowest priority a process can ask for itself
# (tests/make_test.py; nothing else is tuned), two streams side by side: lint then the unit tests, and the role
# tests. Their logs, artifacts/lint-and-unit.log and artifacts/role-tests.log, are printed at the end.
# `make unit role lab-test` runs them one after the other (with the slow role tests).
test: host-deps venv ## lint, unit tests and lab integration tests (root; brings the lab up)
	$(PY) tests/make_test.py --log artifacts/lint-and-unit.log \
	  --beside '$(RUFF)' --beside '$(YAMLLINT)' --beside '$(ANSIBLE_LINT)' --beside '$(IMPORT_CONTRACTS)' \
	  --beside '$(SANITY)' \
	  --beside '$(UNIT_TESTS) --durations=15' \
	  --log artifacts/role-tests.log --beside '$(ROLE_TESTS) --durations=15' \
	  -- $(LAB_TESTS) --durations=20

unit: lint ## the fast loop: lint and the unit tests (pure Python: no playbook run, no lab)
	$(UNIT_TESTS)

role: venv ## the role tests: roles and playbooks through ansible-playbook on this machine (the slow ones too), no lab
	$(ROLE_TESTS)
	$(SLOW_TESTS)

lint: venv ## ruff, yamllint, ansible-lint, the import contracts, ansible-test sanity and the changelog fragments
	$(RUFF)
	$(YAMLLINT)
	$(ANSIBLE_LINT)
	$(IMPORT_CONTRACTS)
	$(SANITY)
	cd collections/ansible_collections/atlas/serving && $(CURDIR)/$(VENV)/bin/antsibull-changelog lint

lab-test: host-deps venv ## the lab integration tests alone
	$(LAB_TESTS)

# The fault drills: one lab, each fault injected in turn, a table of fault / expected / observed / client
# requests failed / data lost (artifacts/drills/). docs/lab.md, "Fault drills".
drills: host-deps venv ## every fault drill on a lab of its own (~50 minutes)
	$(VENV)/bin/pytest -ra tests/drills

# The drill rows that stand in for lab tests (rollouts too long for `make test`); `.ci/run` runs them after
# `make test`, on a lab of their own.
CI_DRILLS ?= node-lost
ci-drills: host-deps venv ## the drill rows CI runs after make test (CI_DRILLS)
	$(VENV)/bin/pytest -ra tests/drills -k "$(CI_DRILLS)"

# The lab tests marked ci_lab (the container releases: minutes of lab time), on a lab of their own; `.ci/run`
# runs them after make test.
ci-lab: host-deps venv ## the lab tests CI runs after make test (marker ci_lab)
	$(VENV)/bin/pytest -ra -m ci_lab tests/lab

# The role tests marked slow (a role's whole stack converged several times over: minutes beside the lab tests);
# `.ci/run` runs them after make test, `make role` with the others.
ci-slow: venv ## the slow role tests CI runs after make test (marker slow)
	$(SLOW_TESTS) --durations=10

# The atlasctl wheel and the atlas.serving collection tarball (dist/): the product and the suite it
# drives, no lab code (DESIGN.md, "Installing"); execution-environment.yml installs both.
wheel: venv ## the atlasctl wheel and the collection tarball in dist/
	$(PY) -c 'import sys; from atlasctl.bundle_sources import atlasctl_wheel as w, collection_tarball as c; \
	  print(w(*sys.argv[1:]), c(*sys.argv[1:]))' . dist

host-deps: ## the Debian packages the lab and the tests need (apt-get; root)
	@missing=""; for p in $(HOST_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing host packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

venv: $(VENV)/.installed $(DEB_TOOLS) ## the virtualenv .venv: requirements.txt, atlasctl and atlas-lab (editable), promtool, prometheus, nginx

# atlas_serving_collection.pth puts the checkout's collections/ on the venv's Python path, as the wheel does with
# its own copy (setup.py): atlasctl, atlas-lab and the tests import the collection's code by its package name.
$(VENV)/.installed: requirements.txt pyproject.toml tools/atlas-lab/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e . -e tools/atlas-lab
	$(PY) -c 'import pathlib, sys, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], sys.argv[1]).write_text(sys.argv[2] + "\n")' \
	  atlas_serving_collection.pth $(CURDIR)/collections
	touch $@

$(VENV)/bin/promtool: | $(VENV)/.installed
	sh tests/deb_tool.sh prometheus ./usr/bin/promtool $(CURDIR)/$@

$(VENV)/bin/prometheus: | $(VENV)/.installed
	sh tests/deb_tool.sh prometheus ./usr/bin/prometheus $(CURDIR)/$@

$(VENV)/bin/nginx: | $(VENV)/.installed
	sh tests/deb_tool.sh nginx ./usr/sbin/nginx $(CURDIR)/$@

lab-up: host-deps venv ## bring the lab up (atlas-lab up)
	$(LAB) up

lab-down: venv ## bring the lab down (atlas-lab down)
	$(LAB) down

bundle: venv ## build the lab's offline bundle (atlas-lab bundle)
	$(LAB) bundle

site: venv ## site.yml on the lab
	$(VENV)/bin/ansible-playbook -i inventory/lab site.yml

# Benchmarks print figures; they are not timed tests. docs/performance.md has the figures and the machine.
bench-verify: venv ## model verification against md5sum + sha256sum and this machine's limit
	$(PY) -m atlaslab.benchmarks.verify

bench-client: venv ## atlasctl bench's accuracy against injected delays
	$(PY) -m atlaslab.benchmarks.accuracy --json artifacts/bench/accuracy.json

# The example bank's engine wheelhouses (vllm-ascend 0.11.0, 0.23.0 and 0.23.0.post1, SGLang 0.5.8 for Ascend) built
# for their targets and installed with no index for each: downloads gigabytes, so not part of make test. A set whose
# vendor wheels are not in --vendor-dir is refused with their names (docs/engine-wheelhouse.md). Then the 0.23.0 set
# built from the index installed as a node installs it, under qemu-user in a Debian 12 arm64 sysroot, its one vendor
# wheel (triton-ascend, from Huawei's mirror) a named metadata-only stand-in, and imported as far as CANN.
bench-wheelhouse: venv ## the example bank's engine wheelhouses, built and installed offline
	$(PY) -m atlaslab.benchmarks.wheelhouse --spec inventory/example-bank/bundle.yml --json artifacts/bench/wheelhouse.json
	$(PY) -m atlaslab.benchmarks.wheelhouse --spec inventory/example-bank/bundle.yml --set vllm-ascend-0.23.0 \
	  --stand-in-vendor --install --json artifacts/bench/wheelhouse-install.json

bench-rollout: host-deps venv ## rollout wall time on a generated lab of 4 to 24 nodes
	$(PY) -m atlaslab.benchmarks.rollout --sizes 4,8,16,24 --json artifacts/bench/rollout.json

# Over the lab (brought up for the run if it is not up): a signed bundle pushed to every serving node directly, then
# along the fan-out tree; the controller's bytes over the bundle's and the wall time; then the plan of a generated
# 96-node, 12-branch fleet (docs/fleet-scale.md). `python -m atlaslab.benchmarks.stage --plan-only` needs no lab.
bench-stage: host-deps venv ## bundle staging: fan-out against a direct push over the lab, and the plan at 96 nodes
	$(PY) -m atlaslab.benchmarks.stage --json artifacts/bench/stage.json

# Installs nothing: without the venv's atlas-lab there is no lab of this checkout to bring down.
clean: ## bring the lab down and remove the venv
	if [ -x $(LAB) ]; then $(LAB) down; fi
	rm -rf $(VENV)

# Quick start on a fresh Debian 12 machine (root):
#   make demo   # host packages, venv, lab, offline bundle, site.yml on the lab, fleet table
#   make test   # lint + unit tests + lab integration tests
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
ATLASCTL := $(VENV)/bin/atlasctl
LAB := $(VENV)/bin/atlas-lab
HOST_PACKAGES := debootstrap systemd-container nftables zstd openssh-client iproute2 rsync curl gnupg gpgv
# Tools only: installed without their Recommends, and a service the package starts on a host that runs
# systemd is stopped and disabled. prometheus: promtool, which tests/unit/test_monitoring_rules.py runs
# (`promtool check rules`, `promtool test rules`); the host needs the tool, not a Prometheus server.
HOST_TOOL_PACKAGES := prometheus
HOST_TOOL_SERVICES := prometheus.service
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export PYTHONUNBUFFERED := 1

.PHONY: demo test lint unit lab-test drills ci-drills host-deps venv lab-up lab-down bundle site bench-verify bench-client \
	bench-rollout bench-wheelhouse clean wheel

demo: host-deps venv
	$(LAB) up
	$(LAB) bundle
	$(VENV)/bin/ansible-playbook -i inventory/lab site.yml
	$(ATLASCTL) health -i inventory/lab

# Lint, then the unit tests, run beside the lab tests (the lab mostly waits on its nodes);
# all three must pass. Their output: artifacts/lint-and-unit.log, printed at the end.
# They run in the background: the lab tests are the longer job, and the CPU they need goes to
# them first. `nice` alone does not do that here: with the kernel's autogroup scheduling (on by
# default), CPU is shared between sessions first and nice only orders processes inside one, and
# every lab node and each of its services is a session of its own. So lint and unit tests get a
# session of their own (setsid) whose autogroup is set to nice 19 (proc(5), /proc/PID/autogroup);
# `nice -n 15` inside it is for kernels without autogroup, where plain nice is what orders them. Ansible's
# workers call setsid(), so the unit tests' playbook runs each get a fresh autogroup at nice 0 and still compete
# (docs/fast-paths.md, "Stop 29"). So where the cgroup-v1 CPU controller can be written (root), lint and
# unit tests run in a CPU group of their own, $(UNIT_CGROUP), of cpu.shares $(UNIT_CPU_SHARES): a task
# outside the root group is not autogrouped (sched(7), "The autogroup feature"), so Ansible's workers stay
# in it too, and the lab's sessions (1024 each) get the cores first. Where it cannot, the above still holds.
UNIT_CGROUP := /sys/fs/cgroup/cpu/atlas-make-test
UNIT_CPU_SHARES := 64
test: host-deps venv
	@mkdir -p artifacts; \
	setsid -w sh -c 'g=$(UNIT_CGROUP); if [ -w $(dir $(UNIT_CGROUP))cpu.shares ] && mkdir -p $$g 2>/dev/null && echo $(UNIT_CPU_SHARES) > $$g/cpu.shares \
	    && echo $$$$ > $$g/cgroup.procs; then echo "lint and unit tests: CPU group $$g, cpu.shares $(UNIT_CPU_SHARES)"; \
	  else echo "lint and unit tests: no CPU group ($$g cannot be written), autogroup nice 19"; fi; \
	  echo 19 > /proc/self/autogroup 2>/dev/null; \
	  nice -n 15 $(MAKE) --no-print-directory lint; l=$$?; nice -n 15 $(VENV)/bin/pytest -ra --durations=15 -m "not lab" tests --ignore=tests/drills; \
	  u=$$?; echo "lint exit $$l, unit tests exit $$u"; [ $$l -eq 0 ] && [ $$u -eq 0 ]' \
	  > artifacts/lint-and-unit.log 2>&1 & unit=$$!; \
	lab=0; $(VENV)/bin/pytest -ra --durations=20 -m lab tests --ignore=tests/drills || lab=$$?; \
	rc=0; wait $$unit || rc=$$?; rmdir $(UNIT_CGROUP) 2>/dev/null || true; \
	echo "--- lint and unit tests (run beside the lab tests; artifacts/lint-and-unit.log)"; \
	cat artifacts/lint-and-unit.log; \
	if [ $$lab -ne 0 ] || [ $$rc -ne 0 ]; then echo "make test: lab tests exit $$lab, lint and unit tests exit $$rc"; exit 1; fi

unit: venv
	$(VENV)/bin/pytest -ra -m "not lab" tests --ignore=tests/drills

lab-test: host-deps venv
	$(VENV)/bin/pytest -ra -m lab tests --ignore=tests/drills

# The fault drills: one lab, every fault of the issues injected in turn, a table of
# fault / expected / observed / client requests failed / data lost (artifacts/drills/).
drills: host-deps venv
	$(VENV)/bin/pytest -ra tests/drills

# The drill rows that stand in for lab tests (long rollouts moved out of `make test`); `.ci/run` runs
# them after `make test` on a lab of their own.
CI_DRILLS ?= node-lost
ci-drills: host-deps venv
	$(VENV)/bin/pytest -ra tests/drills -k "$(CI_DRILLS)"

# The atlasctl wheel and the atlas.serving collection tarball (dist/): the product and the suite it
# drives, no lab code (DESIGN.md, "Installing"); execution-environment.yml installs both.
wheel: venv
	$(PY) -c 'import sys; from atlasctl.bundle_sources import atlasctl_wheel as w, collection_tarball as c; \
	  print(w(*sys.argv[1:]), c(*sys.argv[1:]))' . dist

lint: venv
	$(VENV)/bin/ruff check tools tests collections
	$(VENV)/bin/yamllint -s .
	$(VENV)/bin/ansible-lint --offline -q
	$(VENV)/bin/lint-imports --no-cache

host-deps:
	@missing=""; for p in $(HOST_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing host packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@missing=""; for p in $(HOST_TOOL_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing host tools:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  if [ -d /run/systemd/system ]; then systemctl disable --now $(HOST_TOOL_SERVICES); fi; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml tools/atlas-lab/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e . -e tools/atlas-lab
	touch $@

lab-up: host-deps venv
	$(LAB) up

lab-down: venv
	$(LAB) down

bundle: venv
	$(LAB) bundle

site: venv
	$(VENV)/bin/ansible-playbook -i inventory/lab site.yml

# Benchmarks print figures; they are not timed tests.
bench-verify: venv
	$(PY) -m atlaslab.benchmarks.verify

bench-client: venv
	$(PY) -m atlaslab.benchmarks.accuracy --json artifacts/bench/accuracy.json

# The example bank's engine wheelhouses (vllm-ascend 0.11.0 and 0.23.0.post1, SGLang 0.5.8 for Ascend) built for
# their targets and installed with no index for each: downloads gigabytes, so not part of make test. A set whose
# vendor wheels are not in --vendor-dir is refused with their names (docs/engine-wheelhouse.md).
bench-wheelhouse: venv
	$(PY) -m atlaslab.benchmarks.wheelhouse --spec inventory/example-bank/bundle.yml --json artifacts/bench/wheelhouse.json

bench-rollout: host-deps venv
	$(PY) -m atlaslab.benchmarks.rollout --sizes 4,8,16,24 --json artifacts/bench/rollout.json

clean: lab-down
	rm -rf $(VENV)

"""The site's controller is air-gapped too: a bare lab node with no route out (atlas-ctl) installs the
suite from the bundle's controller kit alone (the signature checked first, no package index), then
drives the fleet: `atlasctl health` and `atlasctl doctor` run there, and so does the whole fleet's second
`site.yml` (full_fleet's, conftest.py: plain ansible-playbook from the installed suite, with the site's
inventory carried there), which changes nothing."""

from __future__ import annotations

import json

import pytest
from labtools import (
    CONTROLLER,
    CONTROLLER_INVENTORY,
    CONTROLLER_PREFIX,
    NODE_BUNDLE,
    ROOT,
    SERVING,
    controller_pin,
    on_node,
    recap,
)

pytestmark = pytest.mark.lab

BIN = f"{CONTROLLER_PREFIX}/venv/bin"


@pytest.fixture(scope="module")
def controller(converged_lab):
    assert converged_lab.first.returncode == 0, converged_lab.first.stdout[-4000:]
    assert converged_lab.controller is not None
    return converged_lab


def test_the_controller_has_no_route_out(controller):
    out = on_node(CONTROLLER, "ip route; curl -s -m 3 -o /dev/null https://pypi.org/simple/ && echo REACHED"
                              " || echo no-route", check=False).stdout
    assert "default" not in out and "no-route" in out, out


def test_it_installs_from_the_signed_bundle_alone(controller):
    verify, install = controller.controller
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert install.returncode == 0, install.stdout + install.stderr
    freeze = on_node(CONTROLLER, f"{BIN}/python -m pip list --format=json --disable-pip-version-check").stdout
    installed = {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(freeze)}
    pins = dict(line.split("==") for line in (ROOT / "requirements-controller.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    assert {name: installed.get(name) for name in pins} == pins, "the controller runs the pinned closure"
    assert "atlasctl" in installed
    lab = on_node(CONTROLLER, f"{BIN}/python -c 'import atlaslab'", check=False)
    assert lab.returncode != 0 and "No module named 'atlaslab'" in lab.stderr + lab.stdout
    galaxy = on_node(CONTROLLER, f"{BIN}/ansible-galaxy collection list -p {CONTROLLER_PREFIX}/suite/collections")
    assert "atlas.serving" in galaxy.stdout, galaxy.stdout


def test_a_tampered_kit_installs_nothing(controller):
    copy, prefix = "/root/tampered-bundle", "/opt/tampered"
    on_node(CONTROLLER, f"rm -rf {copy} {prefix} && mkdir -p {copy} && cp -a {NODE_BUNDLE}/manifest.json"
                        f" {NODE_BUNDLE}/manifest.json.asc {NODE_BUNDLE}/controller {NODE_BUNDLE}/suite {copy}/ &&"
                        " printf X | dd bs=1 seek=100"
                        f" conv=notrunc status=none of=$(ls {copy}/controller/wheels/jinja2-*.whl)")
    try:
        run = on_node(CONTROLLER, f"sh {copy}/controller/install.sh {controller_pin()} {prefix}", check=False,
                      timeout=300)
        assert run.returncode != 0
        assert "sha256 mismatch: expected" in run.stderr and "jinja2-" in run.stderr, run.stderr
        unsigned = on_node(CONTROLLER, f"rm {copy}/manifest.json.asc && sh {copy}/controller/install.sh"
                                       f" {controller_pin()} {prefix}", check=False, timeout=300)
        assert unsigned.returncode != 0 and "is NOT signed" in unsigned.stderr, unsigned.stderr
        assert on_node(CONTROLLER, f"test -e {prefix}", check=False).returncode != 0, "something was installed"
    finally:
        on_node(CONTROLLER, f"rm -rf {copy} {prefix}", check=False)


def test_site_yml_from_the_controller_changes_nothing_on_the_converged_fleet(controller, full_fleet):
    assert full_fleet.second_from == CONTROLLER, "the second site run fell back to the lab host"
    full_fleet.assert_converged()  # both runs succeeded, the second changed nothing on any host
    stats = recap(full_fleet.second.stdout)
    assert set(SERVING) <= set(stats) and all(s["failed"] == 0 for s in stats.values()), stats


def test_atlasctl_health_and_doctor_run_from_the_controller(controller):
    health = on_node(CONTROLLER, f"{BIN}/atlasctl health -i {CONTROLLER_INVENTORY}", check=False, timeout=900)
    assert health.returncode == 0, health.stdout[-3000:] + health.stderr[-2000:]
    assert all(host in health.stdout for host in SERVING), health.stdout
    doctor = on_node(CONTROLLER, f"{BIN}/atlasctl doctor -i {CONTROLLER_INVENTORY} --json", check=False, timeout=600)
    assert doctor.returncode == 0, doctor.stdout[-3000:] + doctor.stderr[-2000:]
    assert sorted(json.loads(doctor.stdout)["hosts"]) == sorted(SERVING)

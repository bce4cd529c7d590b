"""The rollout benchmark's pure parts: the scale fleet, wave plans, event timing, figures, the table."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
from pathlib import Path

import pytest
import yaml

from atlaslab import config, inventory
from atlaslab.benchmarks import rollout as rb

ROOT = Path(__file__).resolve().parents[3]
T0 = dt.datetime(2026, 11, 30, 8, 0, 0, tzinfo=dt.UTC)


def test_parse_sizes_sorted_unique_and_bounded():
    assert rb.parse_sizes("24,4, 8,16,8") == [4, 8, 16, 24]
    for bad in ("", "0,4", "four", f"{rb.MAX_SERVING_NODES + 1}"):
        with pytest.raises(argparse.ArgumentTypeError):
            rb.parse_sizes(bad)


def test_fleet_defaults_without_the_lab_file():
    data = rb.fleet(8, 4)
    assert (data["bridge"], data["subnet"]) == ("atlasbr0", "10.77.0.0/24")
    assert [n["name"] for n in data["nodes"]][-2:] == ["scale-gw-b1", "scale-gw-b2"]


def test_fleet_size_covers_sizes_noop_and_overhead_in_whole_branches():
    assert rb.fleet_size([4, 8, 16, 24], 4, 4) == 24
    assert rb.fleet_size([4], 4, 4) == 8  # the no-op re-run needs 8 serving nodes
    assert rb.fleet_size([10], 4, 4) == 12
    assert rb.fleet_size([2], 4, 9) == 12  # one node, then 9 waves of one on other nodes


def test_generated_fleet_is_a_valid_lab_file_with_its_own_inventory(tmp_path):
    path = tmp_path / "scale" / "lab.yml"
    data = yaml.safe_load(rb.render_fleet(rb.fleet(24, 4, rb.lab_settings(ROOT))))
    cfg = config.parse(data, path)
    serving = cfg.serving_nodes
    assert len(serving) == 24 and len(cfg.nodes) == 30
    assert {n.npu for n in serving} == {config.NpuSpec("910B4", 4, 32768)}
    assert cfg.groups["branch_b1"] == ["scale-n01", "scale-n02", "scale-n03", "scale-n04"]
    assert cfg.groups["gateway"] == [f"scale-gw-b{i}" for i in range(1, 7)]
    assert cfg.inventory_path == path.parent / "hosts.yml"  # never inventory/lab/hosts.yml
    # the lab's own network: the same blackhole route and nft table guard it
    lab = yaml.safe_load((ROOT / "inventory/lab/lab.yml").read_text())
    assert (cfg.bridge, cfg.subnet, cfg.lab_name) == (lab["bridge"], lab["subnet"], lab["lab_name"])
    assert (cfg.driver_version, cfg.firmware_version) == (lab["driver_version"], lab["firmware_version"])
    hosts = inventory.build(cfg, Path("/k"), Path("/kh"))["all"]["children"]
    assert hosts["gateway"]["hosts"]["scale-gw-b6"]["gateway_branch"] == "b6"
    assert len(hosts["atlas_nodes"]["hosts"]) == 24


def test_scale_inventory_is_sglang_only_and_mirrors_the_lab():
    west = yaml.safe_load((ROOT / "inventory/lab/group_vars/branch_west.yml").read_text())
    nodes = yaml.safe_load((ROOT / "inventory/scale/group_vars/atlas_nodes.yml").read_text())
    # the release and site settings are the lab's own file (a link), so they cannot drift apart
    assert (ROOT / "inventory/scale/group_vars/all.yml").resolve() == (ROOT / "inventory/lab/group_vars/all.yml")
    assert nodes == west
    assert "vllm" not in (ROOT / "inventory/scale/group_vars/atlas_nodes.yml").read_text().split("No vLLM")[0]


def test_gateways_and_wave_plans():
    names = [rb.node_name(i) for i in range(1, 9)]
    assert rb.gateways_for(names, 4) == ["scale-gw-b1", "scale-gw-b2"]
    assert rb.gateways_for(names[3:5], 4) == ["scale-gw-b1", "scale-gw-b2"]
    assert rb.one_wave(names[:3]) == [{"name": "all", "hosts": names[:3], "serial": 3}]
    assert rb.waves_of_one(names[:2]) == [{"name": "w1", "hosts": ["scale-n01"], "serial": 1},
                                          {"name": "w2", "hosts": ["scale-n02"], "serial": 1}]
    assert rb.rollout_limit(names[:2]) == "scale-n01,scale-n02,localhost"


def test_waves_plan_matches_the_rollout_filter():
    from ansible_collections.atlas.serving.plugins.filter.rollout import rollout_plan

    groups = {"atlas_nodes": [rb.node_name(i) for i in range(1, 9)]}
    plan = rollout_plan(rb.waves_of_one(groups["atlas_nodes"][:4]), groups)
    assert [(w["name"], w["hosts"], w["serial"]) for w in plan] == [
        (f"w{i}", [rb.node_name(i)], 1) for i in range(1, 5)]
    plan = rollout_plan(rb.one_wave(groups["atlas_nodes"]), groups)
    assert plan[0]["serial"] == 8 and len(plan) == 1


class Events:
    """Synthetic runner events with increasing counters and given times (seconds after T0)."""

    def __init__(self):
        self.events: list[dict] = []

    def add(self, kind: str, at: float, **data) -> Events:
        self.events.append({"event": kind, "counter": len(self.events) + 1,
                            "created": (T0 + dt.timedelta(seconds=at)).isoformat(), "event_data": data})
        return self


def _wave(ev: Events, index: int, start: float, hosts: list[str], tasks: list[tuple[str, float]]) -> float:
    ev.add("playbook_on_play_start", start, play=f"Rollout | wave {index}")
    t = start + 0.5  # play setup before the first task
    for name, seconds in tasks:
        ev.add("playbook_on_task_start", t, play=f"Rollout | wave {index}", task=name)
        for h in hosts:
            ev.add("runner_on_start", t + 0.01, play=f"Rollout | wave {index}", task=name, host=h)
        for h in hosts:
            ev.add("runner_on_ok", t + seconds, play=f"Rollout | wave {index}", task=name, host=h,
                   duration=seconds - 0.01)
        t += seconds + 0.1
    return t + 0.4  # play end


def test_waves_and_task_profile_from_events():
    ev = Events()
    ev.add("playbook_on_start", 0).add("playbook_on_play_start", 0.1, play="Rollout | plan")
    ev.add("playbook_on_task_start", 0.2, play="Rollout | plan", task="Rollout | plan | the waves")
    ev.add("runner_on_ok", 0.3, play="Rollout | plan", task="Rollout | plan | the waves", host="localhost",
           duration=0.1)
    end = _wave(ev, 1, 1.0, ["scale-n01"], [("stage", 2.0), ("restart", 1.0)])
    end = _wave(ev, 2, end, ["scale-n02", "scale-n03"], [("stage", 3.0), ("restart", 1.0)])
    ev.add("playbook_on_play_start", end, play="Rollout | wave 3")
    ev.add("playbook_on_no_hosts_matched", end, play="Rollout | wave 3")
    ev.add("playbook_on_play_start", end + 0.1, play="Health | service")
    ev.add("playbook_on_stats", end + 3)
    found = rb.waves(ev.events)
    assert [w["index"] for w in found] == [1, 2]
    one, two = found
    assert one["hosts"] == ["scale-n01"] and two["hosts"] == ["scale-n02", "scale-n03"]
    # wave 1: play start 1.0, first host start 1.51, last result 1.5 + 2 + 0.1 + 1 = 4.6, next play 5.1
    assert one["seconds"] == pytest.approx(4.1, abs=0.01)
    assert one["span"] == pytest.approx(4.6 - 1.51, abs=0.01)
    assert one["overhead"] == pytest.approx(one["seconds"] - one["span"], abs=0.02)
    assert two["task_mean"] == pytest.approx((2.99 * 2 + 0.99 * 2) / 4, abs=0.001)
    profile = rb.task_profile(ev.events)
    assert profile[0][0] == "stage" and profile[0][2] == 2
    assert profile[0][1] == pytest.approx(2.1 + 3.1, abs=0.01)
    assert all(name != "Rollout | plan | the waves" for name, _, _ in profile)


def test_waves_merges_serial_batches_of_one_wave():
    ev = Events()
    end = _wave(ev, 1, 0.0, ["a"], [("t", 1.0)])
    end = _wave(ev, 1, end, ["b"], [("t", 1.0)])
    ev.add("playbook_on_stats", end)
    (wave,) = rb.waves(ev.events)
    assert wave["hosts"] == ["a", "b"] and wave["seconds"] == pytest.approx(4.0, abs=0.01)


def test_recap_parses_plain_output():
    out = ("PLAY RECAP *********\n"
           "scale-gw-b1                : ok=12   changed=0    unreachable=0    failed=0    skipped=3    rescued=0  "
           "  ignored=0\n"
           "scale-n01                  : ok=140  changed=2    unreachable=0    failed=0    skipped=20   rescued=0  "
           "  ignored=0\n\nsomething else\n")
    stats = rb.recap(out)
    assert stats["scale-n01"]["changed"] == 2 and stats["scale-gw-b1"]["ok"] == 12
    assert rb.recap("no recap here") == {}


def _res(wall: float, waves: list[tuple[float, float]], cpu: float = 40.0) -> dict:
    return {"wall": wall, "waves": [{"seconds": s, "overhead": o, "task_mean": 0.3} for s, o in waves],
            "busy_pct": 90.0, "ctrl_cpu_s": cpu / 4, "cpu_s": cpu}


def _figures():
    one = _res(30.0, [(20.0, 0.2)])
    multi = _res(95.0, [(21.0, 0.3), (22.0, 0.3), (19.0, 0.2), (20.0, 0.2)])
    sized = {4: _res(40.0, [(28.0, 0.4)]), 24: _res(120.0, [(100.0, 1.0)], cpu=480.0)}
    noop = {"seconds": 45.0, "changed": 0, "nodes": 8, "gateways": 2, "plays": [["Serving | x", 12.5]],
            "host_tasks": 900, "cpu_s": 90.0, "ctrl_cpu_s": 36.0, "nodes_cpu_s": 54.0,
            "top_tasks": [["Health | completion", 3.0, 1]]}
    return rb.summarise(one, multi, sized, noop, 4), [one, multi, sized[4], sized[24]]


def test_summarise_ratios_targets_overhead_and_growth():
    fig, runs = _figures()
    assert fig["t1_s"] == 20.0  # median of the one-node wave and the four waves of one: 19 20 20 21 22
    rows = {r["case"]: r for r in fig["rows"]}
    assert rows["one node"]["fixed_s"] == 10.0
    assert rows["4 waves of 1"]["wave_s"] == 82.0
    assert rows["4 waves of 1"]["overhead_s"] == 0.25
    assert rows["4 waves of 1"]["fixed_s"] == 13.0
    assert rows["1 wave of 4"]["target"] is True
    assert rows["1 wave of 24"]["target"] is False
    assert fig["growth_s_per_node"] == pytest.approx((100 - 28) / 20, abs=0.01)
    assert fig["noop"]["target"] is True
    assert rows["1 wave of 24"]["cpu_per_node"] == 20.0 and rows["1 wave of 24"]["ctrl_cpu_per_node"] == 5.0
    proj = fig["projection"]  # budget 1.5 x 20 s x cores; 20 CPU s per node here, 5 on the controller
    assert proj["max_nodes_lab"] == int(30 * proj["cores"] // 20)
    assert proj["max_nodes_controller"] == int(30 * proj["cores"] // 5)
    assert proj["ctrl_cores_for_24"] == 4.0
    missed = rb.summarise(runs[0], runs[1], {}, {"seconds": 30.0, "changed": 1}, 4)
    assert missed["noop"]["target"] is False and missed["growth_s_per_node"] is None


def test_render_prints_every_case_and_missed_targets():
    fig, _ = _figures()
    text = rb.render(fig, {"fleet": "24 SGLang stand-in nodes + 6 gateways", "converge_s": 300.0,
                           "profiles": {"one node": [["Rollout | node | SLO gate", 5.0, 1]]}})
    for case in ("one node", "4 waves of 1", "1 wave of 4", "1 wave of 24"):
        assert re.search(rf"^{re.escape(case)}\s", text, re.M), case
    assert re.search(r"^1 wave of 24 .* MISSED", text, re.M)
    assert re.search(r"^1 wave of 4 .* OK", text, re.M)
    assert "no-op site.yml over 8 serving nodes + 2 gateways: 45.0 s, changed=0" in text
    assert "growth 4 -> 24 nodes in one wave: +3.60 s per extra node" in text
    assert "site.yml converge: 300.0 s" in text
    assert "SLO gate" in text
    assert "12.5 s  Serving | x" in text and "Health | completion" in text
    assert "per host task: 50 ms wall, 100 ms CPU (40 ms controller, 60 ms node)" in text
    assert "CPU bound: a rolled node costs 20.0 CPU s here (5.0 s on the controller)" in text


def test_play_times_sum_plays_of_the_same_name():
    ev = Events()
    ev.add("playbook_on_play_start", 0, play="Preflight").add("playbook_on_task_start", 0.1, play="Preflight", task="a")
    ev.add("playbook_on_play_start", 2, play="Health").add("playbook_on_play_start", 3, play="Gateway")
    ev.add("playbook_on_play_start", 3.5, play="Health").add("playbook_on_stats", 4)
    assert rb.play_times(ev.events) == [["Preflight", 2.0], ["Health", 1.5], ["Gateway", 0.5]]


def test_figures_from_raw_json_and_main_raw(tmp_path, capsys):
    one = {**_res(30.0, [(20.0, 0.2)]), "profile": [["a", 1.0, 1]]}
    raw = {"one": one, "multi": _res(95.0, [(21.0, 0.3), (22.0, 0.3)]), "sized": {"8": _res(50.0, [(40.0, 0.5)])},
           "noop": {"seconds": 70.0, "changed": 0, "nodes": 8, "gateways": 2}, "converge": {"seconds": 99.0},
           "k": 2, "extra": {"fleet": "8 nodes"}}
    for key in ("multi", "sized"):
        (raw[key]["8"] if key == "sized" else raw[key])["profile"] = []
    path = tmp_path / "raw.json"
    path.write_text(json.dumps(raw))
    assert rb.main(["--raw", str(path), "--json", str(tmp_path / "out.json")]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^1 wave of 8 .* 1\.90  MISSED", text, re.M)
    assert "(target <= 60 s with changed=0: MISSED)" in text
    assert json.loads((tmp_path / "out.json").read_text())["figures"]["t1_s"] == 21.0


def test_noop_only_raw_gives_the_noop_figure_alone(tmp_path, capsys):
    noop = {"seconds": 60.0, "changed": 0, "nodes": 8, "gateways": 2, "host_tasks": 600, "cpu_s": 90.0,
            "plays": [["Serving | x", 12.5]]}
    raw = {"noop": noop, "converge": {"seconds": 99.0}, "k": 4, "sized": {}, "extra": {"fleet": "8 nodes"}}
    path = tmp_path / "raw.json"
    path.write_text(json.dumps(raw))
    assert rb.main(["--raw", str(path)]) == 0
    text = capsys.readouterr().out
    assert "no rollouts (--noop-only)" in text and "CASE" in text
    assert ("no-op site.yml over 8 serving nodes + 2 gateways: 60.0 s, changed=0 "
            "(target <= 60 s with changed=0: OK)") in text
    assert "12.5 s  Serving | x" in text
    raw["noop"] = {**noop, "seconds": 60.1}
    path.write_text(json.dumps(raw))
    rb.main(["--raw", str(path)])
    assert "(target <= 60 s with changed=0: MISSED)" in capsys.readouterr().out


def test_noop_only_boots_only_the_noop_subset():
    assert rb.fleet_size([], 4, 0) == rb.NOOP_NODES


def test_inotify_limit_raised_only_when_too_low(tmp_path):
    limit = tmp_path / "max_user_instances"
    limit.write_text("128\n")
    assert rb.ensure_inotify(30, limit) == (128, 1024)
    assert limit.read_text() == "1024\n"
    assert rb.ensure_inotify(30, limit) == (1024, 1024)
    assert rb.inotify_needed(100) == 100 * rb.INOTIFY_PER_NODE + 256


def test_code_version_names_the_commit():
    version = rb.code_version(ROOT)
    assert re.fullmatch(r"[0-9a-f]{4,}(\+[0-9a-f]{8})?", version), version


def test_render_flags_code_that_changed_during_the_run():
    fig, _ = _figures()
    assert "CHANGED during the run" in rb.render(fig, {"code": "abc1234", "code_end": "def5678"})
    assert "CHANGED" not in rb.render(fig, {"code": "abc1234", "code_end": "abc1234"})

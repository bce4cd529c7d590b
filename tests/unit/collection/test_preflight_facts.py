"""atlas.serving.preflight_facts: everything preflight reads on a node in one call. The pieces
(module_utils/node_facts.py) directly, then the module through `ansible localhost`, its platform
facts compared with what `setup` itself reports on the same host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import node_facts

from atlasctl.paths import suite_root

ANSIBLE = Path(sys.executable).with_name("ansible")


def test_free_space_is_what_statvfs_says_and_a_missing_path_is_named(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    free, errors = node_facts.free_gib([str(tmp_path), str(tmp_path / "nope")])
    assert free == {str(tmp_path): round(st.f_bavail * st.f_frsize / 2**30, 2)}
    assert errors == {str(tmp_path / "nope"): f"{tmp_path / 'nope'} does not exist on the node"}


def test_an_install_path_not_made_yet_is_measured_where_it_will_be(tmp_path: Path) -> None:
    """A CANN version installs under the Ascend root, which a bare node may not have yet: its nearest existing
    directory's filesystem is the one that will hold it."""
    free, where = node_facts.free_gib_where(str(tmp_path / "usr/local/Ascend"))
    assert where == str(tmp_path) and free == node_facts.free_gib([str(tmp_path)])[0][str(tmp_path)]
    assert node_facts.free_gib_where(str(tmp_path))[1] == str(tmp_path)


def test_readable_means_a_regular_file_that_can_be_read(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text("{}")
    got = node_facts.readable([str(tmp_path / "m.json"), str(tmp_path), str(tmp_path / "gone")])
    assert got == {str(tmp_path / "m.json"): True, str(tmp_path): False, str(tmp_path / "gone"): False}


def test_exist_means_any_kind_of_path_links_followed(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    paths = [str(tmp_path / n) for n in ("f", "link", "dangling", "gone")] + [str(tmp_path), "/dev/null"]
    assert node_facts.exist(paths) == dict(zip(paths, [True, True, False, False, True, True], strict=True))


def _ansible(module: str, args: dict) -> dict:
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(suite_root() / "collections"),
               ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_LOAD_CALLBACK_PLUGINS="0")
    proc = subprocess.run([str(ANSIBLE), "localhost", "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", "-m", module, "-a", json.dumps(args)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.split("=>", 1)[1])


@pytest.mark.skipif(not ANSIBLE.exists(), reason="ansible is not installed in this virtualenv")
def test_module_reads_everything_in_one_call_as_setup_and_the_fact_modules_do(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{}")
    args = {"npu_smi_path": str(tmp_path / "no-npu-smi"), "install_path": str(tmp_path / "Ascend"),
            "free_space": [str(tmp_path), "/nonexistent-path"], "readable": [str(tmp_path / "manifest.json")],
            "exist": [str(tmp_path), "/nonexistent-path"]}
    got = _ansible("atlas.serving.preflight_facts", args)
    setup = _ansible("ansible.builtin.setup", {"gather_subset": ["!all", "min"]})["ansible_facts"]
    facts = got["ansible_facts"]
    for key in ("architecture", "python_version", "service_mgr"):
        assert facts[key] == setup[f"ansible_{key}"], key
    npu = _ansible("atlas.serving.npu_facts", {"npu_smi_path": args["npu_smi_path"]})["ansible_facts"]["npu"]
    cann = _ansible("atlas.serving.cann_facts", {"install_path": args["install_path"]})["ansible_facts"]["cann"]
    assert facts["npu"] == npu and facts["npu"]["present"] is False and "not found" in facts["npu"]["error"]
    assert facts["cann"] == cann
    assert list(got["free_gib"]) == [str(tmp_path)] and got["free_gib"][str(tmp_path)] > 0
    assert "does not exist" in got["free_errors"]["/nonexistent-path"]
    assert got["readable"] == {str(tmp_path / "manifest.json"): True}
    assert got["exist"] == {str(tmp_path): True, "/nonexistent-path": False}
    assert got["install_path_measured"] == str(tmp_path) and got["install_path_free_gib"] > 0
    assert got["changed"] is False

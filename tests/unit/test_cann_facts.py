"""CANN facts (module_utils/cann.py) from tables of version-record contents, and from real installs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import cann

from atlaslab.doubles import cann_run

TOOLKIT_83 = (
    "package_name=Ascend-cann-toolkit\nversion=8.3.RC1\ninnerversion=V100R001C83RC1B100\n"
    "arch=x86_64\nos=linux\npath=/usr/local/Ascend/ascend-toolkit/8.3.RC1/x86_64-linux\n"
)
TOOLKIT_85 = TOOLKIT_83.replace("8.3.RC1", "8.5.0")
DRIVER = "Version=24.1.rc1\nascendhal_version=7.35.19\naicpu_version=1.0\ntdt_version=1.0\n"
FIRMWARE = "Version=7.5.0.1.129\n"
KERNELS_83 = "Version=8.3.RC1\npackage_name=Ascend-cann-kernels-910b\nsoc_version=910b\n"
NNAL_83 = "Version=8.3.RC1\npackage_name=Ascend-cann-nnal\n"

# (case, files: {relative path: content}, links: {relative path: target}, expected subset of facts)
CASES = [
    (
        "empty node",
        {},
        {},
        {
            "toolkit.installed": False,
            "kernels.installed": False,
            "nnal.installed": False,
            "driver.installed": False,
            "set_env_scripts": [],
        },
    ),
    (
        "driver and firmware only",
        {"driver/version.info": DRIVER, "firmware/version.info": FIRMWARE},
        {},
        {"driver.version": "24.1.rc1", "firmware.version": "7.5.0.1.129", "toolkit.installed": False},
    ),
    (
        "pre-8.5 toolkit, kernels, nnal",
        {
            "ascend-toolkit/8.3.RC1/x86_64-linux/ascend_toolkit_install.info": TOOLKIT_83,
            "ascend-toolkit/set_env.sh": "export ASCEND_TOOLKIT_HOME=x\n",
            "ascend-toolkit/8.3.RC1/opp_kernel/version.info": KERNELS_83,
            "nnal/atb/8.3.RC1/version.info": NNAL_83,
            "nnal/atb/set_env.sh": "export ATB_HOME_PATH=x\n",
        },
        {"ascend-toolkit/latest": "8.3.RC1", "nnal/atb/latest": "8.3.RC1"},
        {
            "toolkit.version": "8.3.RC1",
            "toolkit.layout": "ascend-toolkit",
            "toolkit.innerversion": "V100R001C83RC1B100",
            "toolkit.arch": "x86_64",
            "kernels.version": "8.3.RC1",
            "kernels.soc_version": "910b",
            "nnal.version": "8.3.RC1",
            "set_env_scripts": ["ascend-toolkit/set_env.sh", "nnal/atb/set_env.sh"],
            "serving_set_env_scripts": ["ascend-toolkit/set_env.sh", "nnal/atb/set_env.sh"],
        },
    ),
    (
        "8.5 layout with the compatibility link",
        {
            "cann-8.5.0/x86_64-linux/ascend_toolkit_install.info": TOOLKIT_85,
            "cann-8.5.0/set_env.sh": "export ASCEND_TOOLKIT_HOME=x\n",
            "ascend-toolkit/set_env.sh": ". cann/set_env.sh\n",
        },
        {"cann": "cann-8.5.0", "ascend-toolkit/latest": "../cann-8.5.0"},
        {
            "toolkit.version": "8.5.0",
            "toolkit.layout": "cann",
            "kernels.installed": False,
            "set_env_scripts": ["cann/set_env.sh", "ascend-toolkit/set_env.sh"],
            "serving_set_env_scripts": ["cann/set_env.sh"],
        },
    ),
    (
        "record with comments, spaces and upper-case keys",
        {"ascend-toolkit/7.0.RC1/x86_64-linux/ascend_toolkit_install.info": "# r\n\nVersion = 7.0.RC1\nARCH=x86_64\n"},
        {"ascend-toolkit/latest": "7.0.RC1"},
        {"toolkit.version": "7.0.RC1", "toolkit.arch": "x86_64"},
    ),
    (
        "aarch64 record on its own arch dir",
        {"ascend-toolkit/8.0.0/aarch64-linux/ascend_toolkit_install.info": "version=8.0.0\narch=aarch64\n"},
        {"ascend-toolkit/latest": "8.0.0"},
        {"toolkit.version": "8.0.0", "toolkit.arch": "aarch64"},
    ),
    (
        "dangling latest link after a broken uninstall",
        {"ascend-toolkit/set_env.sh": "x\n"},
        {"ascend-toolkit/latest": "8.2.RC1"},
        {"toolkit.installed": False, "set_env_scripts": ["ascend-toolkit/set_env.sh"]},
    ),
    (
        "kernels record without a version is not an install",
        {
            "ascend-toolkit/8.3.RC1/x86_64-linux/ascend_toolkit_install.info": TOOLKIT_83,
            "ascend-toolkit/8.3.RC1/opp_kernel/version.info": "package_name=Ascend-cann-kernels-910b\n",
        },
        {"ascend-toolkit/latest": "8.3.RC1"},
        {"toolkit.installed": True, "kernels.installed": False},
    ),
]


def lookup(facts: dict, dotted: str):
    value = facts
    for part in dotted.split("."):
        value = value[part]
    return value


@pytest.mark.parametrize(("files", "links", "expected"), [case[1:] for case in CASES], ids=[c[0] for c in CASES])
def test_gather_from_records(tmp_path: Path, files: dict, links: dict, expected: dict) -> None:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    for rel, target in links.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, tmp_path / rel)
    facts = cann.gather(str(tmp_path), host_arch="x86_64")
    assert facts["install_path"] == str(tmp_path)
    for dotted, want in expected.items():
        got = lookup(facts, dotted)
        if dotted.endswith("set_env_scripts"):
            want = [str(tmp_path / rel) for rel in want]
        assert got == want, dotted


VERSIONS = ["7.0.RC1", "7.0.0", "7.0.1.1", "8.0.RC2", "8.0.RC3", "8.0.0", "8.2.RC1", "8.3.RC1", "8.5.0", "9.1.0"]


def test_version_key_matches_the_builder() -> None:
    assert sorted(reversed(VERSIONS), key=cann.version_key) == VERSIONS
    for version in VERSIONS:
        assert cann.version_key(version) == cann_run.version_key(version)
    assert cann.version_key("8.0.RC2.alpha002") == cann.version_key("8.0.RC2")
    assert cann.version_key("garbage") is None


@pytest.mark.parametrize(
    ("installed", "wanted", "action"),
    [
        (None, "8.3.RC1", "install"),
        ("8.3.RC1", "8.3.RC1", "none"),
        ("8.2.RC1", "8.3.RC1", "upgrade"),
        ("8.3.RC1", "8.5.0", "upgrade"),
        ("8.0.0", "8.0.RC3", "downgrade"),
        ("8.5.0", "7.0.RC1", "downgrade"),
    ],
)
def test_plan_action(installed: str | None, wanted: str, action: str) -> None:
    assert cann.plan_action(installed, wanted) == action


def test_plan_action_names_unparsable_versions() -> None:
    with pytest.raises(ValueError, match="'8.x'"):
        cann.plan_action("8.x", "8.3.RC1")


@pytest.mark.parametrize("version", ["8.3.RC1", "8.5.0"])
def test_gather_reads_what_the_installers_write(tmp_path: Path, version: str) -> None:
    import subprocess

    env = {**os.environ, "ATLAS_CANN_SYSROOT": str(tmp_path / "sys")}
    root = tmp_path / "Ascend"
    for pkg in cann_run.build_cann_packages(tmp_path / "pkgs", version):
        args = ["bash", str(pkg), "--install", f"--install-path={root}", "--quiet"]
        subprocess.run(args, env=env, check=True, capture_output=True)
    facts = cann.gather(str(root), host_arch="x86_64")
    assert facts["toolkit"]["version"] == version
    assert facts["kernels"]["version"] == version
    assert facts["nnal"]["version"] == version
    assert Path(facts["toolkit"]["uninstall_script"]).is_file()
    assert Path(facts["nnal"]["uninstall_script"]).is_file()
    assert facts["serving_set_env_scripts"][-1] == str(root / "nnal/atb/set_env.sh")


# --- versions side by side: what is installed, the plan, what each release pins, the prune ------------------

def _install(root: Path, tmp: Path, *versions: str) -> None:
    env = {**os.environ, "ATLAS_CANN_SYSROOT": str(tmp / "sysroot"), "TMPDIR": str(tmp)}
    for version in versions:
        for pkg in cann_run.build_cann_packages(tmp / "pkgs", version):
            if pkg.suffix == ".zip":
                continue
            argv = ["bash", str(pkg), "--nox11", "--install", f"--install-path={root}", "--quiet"]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr


def test_installed_versions_reads_each_version_and_its_own_scripts(tmp_path: Path) -> None:
    root = tmp_path / "Ascend"
    _install(root, tmp_path, "8.2.RC1", "8.3.RC1")
    versions = cann.installed_versions(str(root), "x86_64")
    assert sorted(versions) == ["8.2.RC1", "8.3.RC1"]
    for version in versions:
        entry = versions[version]
        assert (entry["toolkit"], entry["kernels"], entry["nnal"]) == (version, version, version)
        assert entry["set_env_scripts"] == [str(root / f"ascend-toolkit/{version}/bin/setenv.bash"),
                                            str(root / f"nnal/atb/{version}/atb/set_env.sh")]
    assert cann.gather(str(root), "x86_64")["toolkit"]["version"] == "8.3.RC1"  # the links: the last installed


@pytest.mark.parametrize(("installed", "wanted", "actions", "removes"), [
    ({}, "8.5.0", {"toolkit": "install", "kernels": "install", "nnal": "install"}, []),
    ({"8.3.RC2": "ascend-toolkit"}, "8.3.RC1", {"toolkit": "install", "kernels": "install", "nnal": "install"}, []),
    ({"8.5.0": "cann"}, "9.1.0", {"toolkit": "install", "kernels": "install", "nnal": "install"}, []),
    ({"8.3.RC2": "ascend-toolkit", "8.2.RC1": "ascend-toolkit"}, "8.5.0",
     {"toolkit": "upgrade", "kernels": "install", "nnal": "install"}, ["8.2.RC1", "8.3.RC2"]),
    ({"8.5.0": "cann", "9.1.0": "cann"}, "8.3.RC2",
     {"toolkit": "install", "kernels": "install", "nnal": "install"}, ["8.5.0", "9.1.0"]),
    ({"8.5.0": "cann"}, "8.5.0", {"toolkit": "none", "kernels": "none", "nnal": "none"}, []),
])
def test_plan_versions(installed: dict, wanted: str, actions: dict, removes: list) -> None:
    versions = {v: {"layout": layout, "toolkit": v, "kernels": v, "nnal": v} for v, layout in installed.items()}
    plan = cann.plan_versions(versions, wanted, ["toolkit", "kernels", "nnal"])
    assert (plan["actions"], plan["removes"], plan["keeps_others"]) == (actions, removes, not removes)
    assert ("cannot stay beside" in plan["why"]) == bool(removes)


def test_release_pins_and_the_prune(tmp_path: Path) -> None:
    for release, record in {"r1": {"cann": "8.3.RC2"}, "r2": {"cann": "8.5.0"}, "img": {"runtime": "container"},
                            "old": {}}.items():
        (tmp_path / release).mkdir()
        (tmp_path / release / "svc.json").write_text(json.dumps(record))
    pins = cann.release_pins(str(tmp_path), "svc")
    assert pins == {"pinned": {"r1": "8.3.RC2", "r2": "8.5.0"}, "unknown": ["old"]}
    versions = dict.fromkeys(("8.2.RC1", "8.3.RC2", "8.5.0", "9.1.0"), {})
    kept = cann.prune_versions(versions, pins, ["9.1.0"], list(versions))
    assert kept["remove"] == [] and "old name no CANN" in kept["why_not"]
    (tmp_path / "old/svc.json").unlink()
    pins = cann.release_pins(str(tmp_path), "svc")
    pruned = cann.prune_versions(versions, pins, ["9.1.0"], ["8.2.RC1", "8.3.RC2", "9.1.0"])
    assert pruned == {"remove": ["8.2.RC1"], "held": {"8.3.RC2": ["r1"], "8.5.0": ["r2"]}, "why_not": ""}

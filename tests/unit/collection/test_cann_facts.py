"""CANN facts (module_utils/cann.py) from tables of version-record contents, from the vendors' records of each CANN
line (tests/fixtures/vendor/cann), through ansible, and from installs by the lab's installer doubles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import cann

from atlaslab.doubles import cann_run
from support import vendor_trees

REPO = Path(__file__).resolve().parents[3]

# Lines in the vendors' shapes (tests/fixtures/vendor/cann/SOURCES.md names where each comes from).
TOOLKIT_83 = (
    "package_name=Ascend-cann-toolkit\nversion=8.3.RC1\ninnerversion=V100R001C23SPC001B046\n"
    "compatible_version=[V100R001C21],[V100R001C23]\narch=x86_64\nos=linux\n"
    "path=/usr/local/Ascend/ascend-toolkit/8.3.RC1/x86_64-linux\n"
)
TOOLKIT_85 = TOOLKIT_83.replace("8.3.RC1", "8.5.0").replace("ascend-toolkit/8.5.0", "cann-8.5.0")
DRIVER = ("Version=24.1.rc2.2\nascendhal_version=7.35.23\naicpu_version=1.0\nInnerversion=V100R001C18SPC001B233\n"
          "compatible_version_fw=[7.0.0,7.2.99]\npackage_version=24.1.rc2.2\n")
DRIVER_WITHOUT_PACKAGE_VERSION = "Version=24.1.rc1\nascendhal_version=7.35.19\naicpu_version=1.0\n"
FIRMWARE = ("Version=7.1.0.11.220\nfirmware_version=1.0\npackage_version=23.0.7\n"
            "compatible_version_drv=[23.0.rc3,23.0.rc3.],[23.0.0,23.0.0.]\n")
KERNELS_83 = "Version=8.3.T5.0.B028\nversion_dir=8.3.RC1\ntimestamp=20250807_092944934\nops_version=8.3.T5.0.B028\n"
NNAL_83 = ("    Ascend-cann-atb : 8.3.RC1\n    Ascend-cann-atb Version : 8.3.RC1.B150\n    Platform : x86_64\n"
           "    branch : br_release_cann_8.3.RC1_20251015\n    commit id : 0a1b2c3d\n")
NNAL_SOURCE_BUILD = "    Platform : x86_64\n    branch : master\n    commit id : ddcc8b62\n"

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
            "versions": {},
        },
    ),
    (
        "driver and firmware: the driver's package_version, the firmware's build and HDK release",
        {"driver/version.info": DRIVER, "firmware/version.info": FIRMWARE},
        {},
        {"driver.version": "24.1.rc2.2", "firmware.version": "7.1.0.11.220", "firmware.package_version": "23.0.7",
         "toolkit.installed": False},
    ),
    (
        "a driver record without package_version",
        {"driver/version.info": DRIVER_WITHOUT_PACKAGE_VERSION},
        {},
        {"driver.version": "24.1.rc1", "driver.package_version": None},
    ),
    (
        "pre-8.5 toolkit, kernels (the release is version_dir), nnal (Key : Value)",
        {
            "ascend-toolkit/8.3.RC1/x86_64-linux/ascend_toolkit_install.info": TOOLKIT_83,
            "ascend-toolkit/latest/version.cfg": "# version: 1.0\ntoolkit_running_version=[8.3.T5.0.B028:8.3.RC1]\n",
            "ascend-toolkit/set_env.sh": "export ASCEND_TOOLKIT_HOME=x\n",
            "ascend-toolkit/8.3.RC1/opp_kernel/version.info": KERNELS_83,
            "nnal/atb/8.3.RC1/version.info": NNAL_83,
            "nnal/atb/set_env.sh": "export ATB_HOME_PATH=x\n",
        },
        {"ascend-toolkit/latest/x86_64-linux/ascend_toolkit_install.info":
         "../../8.3.RC1/x86_64-linux/ascend_toolkit_install.info",
         "nnal/atb/latest": "8.3.RC1"},
        {
            "toolkit.version": "8.3.RC1",
            "toolkit.layout": "ascend-toolkit",
            "toolkit.innerversion": "V100R001C23SPC001B046",
            "toolkit.arch": "x86_64",
            "kernels.version": "8.3.RC1",
            "kernels.build": "8.3.T5.0.B028",
            "kernels.component": "kernels",
            "nnal.version": "8.3.RC1",
            "nnal.build": "8.3.RC1.B150",
            "set_env_scripts": ["ascend-toolkit/set_env.sh", "nnal/atb/set_env.sh"],
            "serving_set_env_scripts": ["ascend-toolkit/set_env.sh", "nnal/atb/set_env.sh"],
        },
    ),
    (
        "8.5 layout with the compatibility link; opp/version.info is the toolkit's, not the ops record",
        {
            "cann-8.5.0/x86_64-linux/ascend_toolkit_install.info": TOOLKIT_85,
            "cann-8.5.0/opp/version.info": "Version=8.5.0.2.220\nversion_dir=8.5.0\n",
            "cann-8.5.0/set_env.sh": "export ASCEND_TOOLKIT_HOME=x\n",
            "ascend-toolkit/set_env.sh": ". cann/set_env.sh\n",
        },
        {"cann": "cann-8.5.0", "ascend-toolkit/latest": "../cann"},
        {
            "toolkit.version": "8.5.0",
            "toolkit.layout": "cann",
            "kernels.installed": False,
            "set_env_scripts": ["cann/set_env.sh", "ascend-toolkit/set_env.sh"],
            "serving_set_env_scripts": ["cann/set_env.sh"],
        },
    ),
    (
        "8.5 ops recorded only in share/info (the Chinese 8.5.0 guide)",
        {
            "cann-8.5.0/x86_64-linux/ascend_toolkit_install.info": TOOLKIT_85,
            "cann-8.5.0/share/info/ops/version.info": "Version=8.5.0.2.220\nversion_dir=8.5.0\n",
        },
        {"cann": "cann-8.5.0"},
        {"kernels.version": "8.5.0", "kernels.component": "ops", "versions.8.5.0.kernels": "8.5.0"},
    ),
    (
        "record with comments, spaces and upper-case keys",
        {"ascend-toolkit/7.0.RC1/x86_64-linux/ascend_toolkit_install.info": "# r\n\nVersion = 7.0.RC1\nARCH=x86_64\n"},
        {"ascend-toolkit/latest": "7.0.RC1"},
        {"toolkit.version": "7.0.RC1", "toolkit.arch": "x86_64"},
    ),
    (
        "dangling latest link after a broken uninstall",
        {"ascend-toolkit/set_env.sh": "x\n"},
        {"ascend-toolkit/latest": "8.2.RC1"},
        {"toolkit.installed": False, "set_env_scripts": ["ascend-toolkit/set_env.sh"]},
    ),
    (
        "kernels record without version_dir is not an install",
        {
            "ascend-toolkit/8.3.RC1/x86_64-linux/ascend_toolkit_install.info": TOOLKIT_83,
            "ascend-toolkit/8.3.RC1/opp_kernel/version.info": "Version=8.3.T5.0.B028\n",
        },
        {"ascend-toolkit/latest": "8.3.RC1"},
        {"toolkit.installed": True, "kernels.installed": False, "versions.8.3.RC1.kernels": None},
    ),
    (
        "NNAL from a source build (no version line): the directory's name; ATB's upgrade backup is no version",
        {"nnal/atb/8.3.RC1/version.info": NNAL_SOURCE_BUILD, "nnal/atb/8.2.RC1_recover/version.info": NNAL_83},
        {"nnal/atb/latest": "8.3.RC1"},
        {"nnal.version": "8.3.RC1", "nnal.build": None, "versions.8.3.RC1.nnal": "8.3.RC1",
         "versions.8.2.RC1_recover": KeyError},
    ),
]


def lookup(facts: dict, dotted: str):
    """``a.b.c`` -> facts[a][b][c]; version keys (``8.3.RC1``) are taken whole."""
    value = facts
    parts = dotted.split(".")
    while parts:
        for size in range(len(parts), 0, -1):
            key = ".".join(parts[:size])
            if isinstance(value, dict) and key in value:
                value, parts = value[key], parts[size:]
                break
        else:
            raise KeyError(dotted)
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
        if want is KeyError:
            with pytest.raises(KeyError):
                lookup(facts, dotted)
            continue
        got = lookup(facts, dotted)
        if dotted.endswith("set_env_scripts"):
            want = [str(tmp_path / rel) for rel in want]
        assert got == want, dotted


# --- the vendors' records of each CANN line, laid out as the installers leave them (tests/support/vendor_trees.py) ---

def expected_paths(line: str) -> dict[str, str]:
    """The records and uninstallers of ``line``, relative to the install root (docs/ascend-platform.md section 5.3)."""
    arch = vendor_trees.ARCH
    if vendor_trees.uses_cann_layout(line):
        vdir = f"cann-{line}"
        kernels_info = f"{vdir}/{arch}-linux/ascend_ops_install.info"
        kernels_uninstall = f"{vdir}/{arch}-linux/script/ops_uninstall.sh"
        nnal_uninstall = "nnal/nnal_uninstall.sh"
    else:
        vdir = f"ascend-toolkit/{line}"
        kernels_info = f"{vdir}/opp_kernel/version.info"
        kernels_uninstall = f"{vdir}/opp_kernel/script/uninstall.sh"
        nnal_uninstall = f"nnal/atb/{line}/scripts/uninstall.sh"
    return {"version_dir": vdir, "toolkit_uninstall": f"{vdir}/{arch}-linux/script/uninstall.sh",
            "kernels_info": kernels_info, "kernels_uninstall": kernels_uninstall, "nnal_uninstall": nnal_uninstall,
            "nnal_version_uninstall": f"nnal/atb/{line}/scripts/uninstall.sh"}


@pytest.mark.parametrize("line", vendor_trees.LINES)
def test_gather_reads_each_lines_vendor_records(tmp_path: Path, line: str) -> None:
    root = vendor_trees.lay_out(tmp_path / "Ascend", line)
    facts = cann.gather(str(root), host_arch="x86_64")  # the records are aarch64's: read whatever the arch
    paths = {key: str(root / rel) for key, rel in expected_paths(line).items()}
    toolkit, kernels, nnal = facts["toolkit"], facts["kernels"], facts["nnal"]
    assert (toolkit["version"], toolkit["version_dir"], toolkit["arch"]) == (line, paths["version_dir"], "aarch64")
    assert toolkit["uninstall_script"] == paths["toolkit_uninstall"]
    assert (kernels["version"], kernels["info_file"]) == (line, paths["kernels_info"])
    assert kernels["uninstall_script"] == paths["kernels_uninstall"]
    if vendor_trees.uses_cann_layout(line):
        assert (kernels["component"], kernels["package_name"]) == ("ops", "Ascend-cann-910b-ops")
    else:
        assert kernels["component"] == "kernels" and kernels["build"] != line
    assert list(facts["versions"]) == [line], "ascend-toolkit/latest, cann and nnal/atb/latest are no versions"
    entry = facts["versions"][line]
    assert (entry["toolkit"], entry["kernels"], entry["version_dir"]) == (line, line, paths["version_dir"])
    assert entry["uninstall_scripts"]["toolkit"] == paths["toolkit_uninstall"]
    assert entry["uninstall_scripts"]["kernels"] == paths["kernels_uninstall"]
    if line == "7.0.RC1":  # no NNAL package was found for 7.0.RC1
        assert not nnal["installed"] and entry["nnal"] is None and "nnal" not in entry["uninstall_scripts"]
    else:
        assert (nnal["version"], nnal["uninstall_script"]) == (line, paths["nnal_uninstall"])
        assert entry["nnal"] == line and entry["uninstall_scripts"]["nnal"] == paths["nnal_version_uninstall"]
    for script in [toolkit["uninstall_script"], kernels["uninstall_script"], *entry["uninstall_scripts"].values()]:
        assert Path(script).is_file(), script


@pytest.mark.parametrize("lines", [("8.0.0", "8.3.RC1"), ("8.5.0", "9.0.0", "9.1.0"), ("9.1.0", "8.5.0")])
def test_gather_reads_lines_side_by_side(tmp_path: Path, lines: tuple[str, ...]) -> None:
    root = vendor_trees.lay_out(tmp_path / "Ascend", *lines)
    facts = cann.gather(str(root), host_arch="aarch64")
    assert sorted(facts["versions"], key=cann.version_key) == sorted(lines, key=cann.version_key)
    for line in lines:
        entry = facts["versions"][line]
        assert (entry["toolkit"], entry["kernels"], entry["nnal"]) == (line, line, line)
        assert entry["version_dir"] == str(root / expected_paths(line)["version_dir"])
    last = lines[-1]  # the links name the last installed
    assert [facts[part]["version"] for part in ("toolkit", "kernels", "nnal")] == [last] * 3
    assert facts["toolkit"]["version_dir"] == str(root / expected_paths(last)["version_dir"])


def test_parsers_of_each_record() -> None:
    nnal = cann.parse_colon_values((vendor_trees.FIXTURES / "9.1.0/nnal/atb/9.1.0/version.info").read_text())
    assert nnal["Ascend-cann-atb"] == "9.1.0" and nnal["Ascend-cann-atb Version"] == "9.1.0.B150"
    assert cann.parse_key_values(nnal_text := NNAL_83) == {} and "Platform" in cann.parse_colon_values(nnal_text)
    kernels = cann.read_kernels_info(str(vendor_trees.FIXTURES / "8.0.0/ascend-toolkit/8.0.0/opp_kernel/version.info"))
    assert (kernels["version"], kernels["build"]) == ("8.0.0", "7.6.0.1.220")
    ops = cann.read_ops_info(str(vendor_trees.FIXTURES / "9.1.0/cann-9.1.0"), "aarch64-linux")
    assert (ops["version"], ops["package_name"]) == ("9.1.0", "Ascend-cann-910b-ops")
    toolkit = cann.read_toolkit_info(
        str(vendor_trees.FIXTURES / "8.5.0/cann-8.5.0/aarch64-linux/ascend_toolkit_install.info"))
    assert (toolkit["version"], toolkit["innerversion"]) == ("8.5.0", "V100R001C25SPC001B212")


def _ansible_cann_facts(root: Path, tmp: Path) -> dict:
    """The real module run by ansible against ``root``: ``ansible localhost -m atlas.serving.cann_facts``."""
    bindir = Path(sys.executable).parent
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PATH": f"{bindir}:{os.environ['PATH']}",
           "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"), "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
           "ANSIBLE_STDOUT_CALLBACK": "minimal", "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    argv = [str(bindir / "ansible"), "localhost", "-m", "atlas.serving.cann_facts", "-a", f"install_path={root}",
            "-e", f"ansible_python_interpreter={sys.executable}"]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    head, _, result = done.stdout.partition(" => ")
    assert head.strip() == "localhost | SUCCESS", done.stdout
    return json.loads(result)["ansible_facts"]["cann"]


@pytest.mark.parametrize("line", ["9.1.0", "8.0.0"])
def test_the_module_through_ansible_reads_real_records(tmp_path: Path, line: str) -> None:
    root = vendor_trees.lay_out(tmp_path / "Ascend", line)
    facts = _ansible_cann_facts(root, tmp_path)
    assert [facts[part]["version"] for part in ("toolkit", "kernels", "nnal")] == [line] * 3
    assert list(facts["versions"]) == [line]
    paths = expected_paths(line)
    assert facts["kernels"]["uninstall_script"] == str(root / paths["kernels_uninstall"])
    assert facts["nnal"]["uninstall_script"] == str(root / paths["nnal_uninstall"])
    assert facts["versions"][line]["uninstall_scripts"]["toolkit"] == str(root / paths["toolkit_uninstall"])


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


def _install(root: Path, tmp: Path, *versions: str) -> None:
    """Install each version with the lab's doubles as Huawei's images do (NNAL with the toolkit's set_env.sh
    sourced)."""
    env = {**os.environ, "ATLAS_CANN_SYSROOT": str(tmp / "sysroot"), "TMPDIR": str(tmp)}
    for version in versions:
        for pkg in cann_run.build_cann_packages(tmp / "pkgs", version):
            if pkg.suffix == ".zip":
                continue
            argv = ["bash", str(pkg), "--nox11", "--install", f"--install-path={root}", "--quiet"]
            if "nnal" in pkg.name:
                argv = ["bash", "-c", '. "$1" && shift && exec "$@"', "nnal", str(root / "ascend-toolkit/set_env.sh"),
                        *argv]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("version", ["8.3.RC1", "8.5.0"])
def test_gather_reads_what_the_installers_write(tmp_path: Path, version: str) -> None:
    root = tmp_path / "Ascend"
    _install(root, tmp_path, version)
    facts = cann.gather(str(root), host_arch="x86_64")
    assert facts["toolkit"]["version"] == version
    assert facts["kernels"]["version"] == version
    assert facts["nnal"]["version"] == version
    assert list(facts["versions"]) == [version]
    assert Path(facts["toolkit"]["uninstall_script"]).is_file()
    assert Path(facts["kernels"]["uninstall_script"]).is_file()
    assert Path(facts["nnal"]["uninstall_script"]).is_file()
    assert all(Path(script).is_file() for script in facts["versions"][version]["uninstall_scripts"].values())
    assert facts["serving_set_env_scripts"][-1] == str(root / "nnal/atb/set_env.sh")


# --- versions side by side: what is installed, the plan, what each release pins, the prune ------------------


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

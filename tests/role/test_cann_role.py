"""The cann role against localhost: install, idempotence, check mode, versions side by side (each pinned by its
own environment scripts, kept while a kept release pins it), across the 8.5 layout and back, tampering, an
installer swapped in the bundle after its check (the checked copy runs), a bundle another account can write."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from atlasctl.bundle import write_manifest
from atlaslab.doubles.cann_run import build_cann_packages
from support.ansible_run import ansible_env, run_playbook
from support.playbooks import ok, swap_at_exec

pytestmark = pytest.mark.role

VERSIONS = ("7.0.RC1", "8.2.RC1", "8.3.RC1", "8.5.0")

PLAYBOOK = """
- name: CANN role test
  hosts: localhost
  gather_facts: false
  roles:
    - role: cann
  post_tasks:
    - name: Show the wiring
      ansible.builtin.copy:
        content: >-
          {{ {'scripts': cann_set_env_scripts,
              'cann': ansible_facts.cann | dict2items | rejectattr('key', 'in', ['pins', 'managed']) | items2dict}
             | to_json }}
        dest: "{{ result_file }}"
        mode: "0600"
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bundle")
    for version in VERSIONS:
        build_cann_packages(root / "cann", version)
    write_manifest(root, "test")  # records the 7.0.RC1 zip's member too
    return root


class Node:
    """A temp install root and the playbook that targets it."""

    def __init__(self, tmp: Path, bundle: Path):
        self.tmp, self.bundle = tmp, bundle
        self.install_path = tmp / "Ascend"
        self.env_file = tmp / "etc/atlas/cann.env"
        self.result = tmp / "result.json"
        (tmp / "play.yml").write_text(PLAYBOOK)
        (tmp / "inventory.ini").write_text(
            f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"
        )

    def play(self, version: str, *extra: str, bundle: Path | None = None,
             verified: str | None = None, path: Path | None = None) -> subprocess.CompletedProcess:
        extra_vars = {
            # what preflight's signature check (roles/bundle_trust) sets: the verified manifest's sha256
            "atlas_bundle_manifest_sha256": verified or sha256((bundle or self.bundle) / "manifest.json"),
            "cann_version": version,
            "cann_bundle_dir": str(bundle or self.bundle),
            "cann_install_path": str(self.install_path),
            "cann_work_dir": str(self.tmp / "work"),
            "cann_env_file": str(self.env_file),
            "cann_managed_file": str(self.tmp / "var/cann-versions.json"),
            "serving_config_dir": str(self.tmp / "serving"),
            "result_file": str(self.result),
        }
        env = ansible_env(self.tmp, path=path, ATLAS_CANN_SYSROOT=str(self.tmp / "sysroot"))
        return run_playbook(self.tmp / "inventory.ini", self.tmp / "play.yml", "-e", json.dumps(extra_vars), *extra,
                            cwd=self.tmp, env=env)

    def facts(self) -> dict:
        return json.loads(self.result.read_text())

    def release(self, name: str, cann: str | None) -> None:
        """A kept serving release whose record pins ``cann`` (None: a record from before releases pinned one)."""
        record = self.tmp / "serving/releases" / name / "atlas-serving.json"
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"release_id": name, "runtime": "venv"} | ({"cann": cann} if cann else {})))


@pytest.fixture()
def node(tmp_path: Path, bundle: Path) -> Node:
    return Node(tmp_path, bundle)


@pytest.mark.slow
def test_check_mode_then_install_then_idempotent(node: Node) -> None:
    check = ok(node.play("8.3.RC1", "--check"))
    assert check["failed"] == 0
    assert not (node.install_path / "ascend-toolkit").exists()

    first = ok(node.play("8.3.RC1"))
    assert first["changed"] >= 3
    facts = node.facts()
    assert facts["cann"]["toolkit"]["version"] == "8.3.RC1"
    assert facts["cann"]["kernels"]["version"] == "8.3.RC1"
    assert facts["cann"]["nnal"]["version"] == "8.3.RC1"
    # the version's own scripts, never the links' (ascend-toolkit/set_env.sh follows `latest`)
    assert facts["scripts"] == [
        str(node.install_path / "ascend-toolkit/8.3.RC1/bin/setenv.bash"),
        str(node.install_path / "nnal/atb/8.3.RC1/atb/set_env.sh"),
    ]
    env_text = node.env_file.read_text()
    assert "ATLAS_CANN_VERSION=8.3.RC1" in env_text
    assert f'ATLAS_CANN_SET_ENV_SCRIPTS="{node.install_path}/ascend-toolkit/8.3.RC1/bin/setenv.bash ' in env_text

    second = ok(node.play("8.3.RC1"))
    assert second["changed"] == 0


@pytest.mark.slow
def test_a_new_version_installs_beside_and_stays_while_a_release_pins_it(node: Node) -> None:
    node.release("r1", "8.2.RC1")
    ok(node.play("8.2.RC1"))
    up = node.play("8.3.RC1")
    ok(up)
    assert "install toolkit 8.3.RC1 from cann/Ascend-cann-toolkit_8.3.RC1_linux-x86_64.run (installed beside: " \
           "8.2.RC1)" in " ".join(up.stdout.split())
    versions = node.facts()["cann"]["versions"]
    assert {v: [versions[v][c] for c in ("toolkit", "kernels", "nnal")] for v in versions} == {
        "8.2.RC1": ["8.2.RC1"] * 3, "8.3.RC1": ["8.3.RC1"] * 3}
    assert node.facts()["scripts"][0] == str(node.install_path / "ascend-toolkit/8.3.RC1/bin/setenv.bash")
    # back to the earlier release's CANN: nothing to install, only its scripts are wired
    node.release("r2", "8.3.RC1")
    back = ok(node.play("8.2.RC1"))
    assert back["changed"] == 2  # the environment file names 8.2.RC1's scripts (and this test's dump of them)
    assert node.facts()["scripts"][0] == str(node.install_path / "ascend-toolkit/8.2.RC1/bin/setenv.bash")
    assert ok(node.play("8.2.RC1"))["changed"] == 0
    # r2 is no longer kept: its CANN goes (the role installed it), r1's stays
    (node.tmp / "serving/releases/r2/atlas-serving.json").unlink()
    pruned = ok(node.play("8.2.RC1"))
    assert pruned["changed"] >= 1 and not (node.install_path / "ascend-toolkit/8.3.RC1").exists()
    assert not (node.install_path / "nnal/atb/8.3.RC1").exists()
    assert sorted(node.facts()["cann"]["versions"]) == ["8.2.RC1"]
    assert json.loads((node.tmp / "var/cann-versions.json").read_text()) == ["8.2.RC1"]


@pytest.mark.slow
def test_a_release_that_pins_nothing_keeps_every_version(node: Node) -> None:
    ok(node.play("8.2.RC1"))
    node.release("old", None)
    run = node.play("8.3.RC1")
    ok(run)
    assert "release(s) old name no CANN in their record" in run.stdout
    assert sorted(node.facts()["cann"]["versions"]) == ["8.2.RC1", "8.3.RC1"]


@pytest.mark.slow
def test_a_version_installed_by_other_hands_is_never_pruned(node: Node, bundle: Path) -> None:
    toolkit = bundle / "cann/Ascend-cann-toolkit_8.2.RC1_linux-x86_64.run"
    by_hand = subprocess.run(["bash", str(toolkit), "--nox11", "--install", f"--install-path={node.install_path}",
                              "--quiet"], env={**os.environ, "ATLAS_CANN_SYSROOT": str(node.tmp / "sysroot")},
                             capture_output=True, text=True, timeout=60)
    assert by_hand.returncode == 0, by_hand.stderr
    ok(node.play("8.3.RC1"))
    assert sorted(node.facts()["cann"]["versions"]) == ["8.2.RC1", "8.3.RC1"]


@pytest.mark.slow
def test_70rc1_from_the_zip_without_nnal(node: Node) -> None:
    ok(node.play("7.0.RC1"))
    facts = node.facts()["cann"]
    assert facts["toolkit"]["version"] == "7.0.RC1" and facts["kernels"]["version"] == "7.0.RC1"
    assert not facts["nnal"]["installed"]
    assert ok(node.play("7.0.RC1"))["changed"] == 0


@pytest.mark.slow
def test_upgrade_across_the_85_layout_and_back(node: Node) -> None:
    """Into the 8.5 layout the toolkit takes --upgrade, which removes the earlier one (the installers cannot keep
    it); back from it every 8.5+ toolkit is uninstalled first."""
    node.release("r1", "8.3.RC1")
    ok(node.play("8.3.RC1"))
    up = node.play("8.5.0")
    ok(up)
    out = " ".join(up.stdout.split())
    assert "upgrade toolkit 8.5.0 from cann/Ascend-cann-toolkit_8.5.0_linux-x86_64.run; CANN 8.3.RC1" in out
    assert "moving to the 8.5 layout takes --upgrade, which removes the earlier versions" in out
    assert "from cann/Ascend-cann-910b-ops_8.5.0_linux-x86_64.run" in up.stdout
    facts = node.facts()
    assert facts["cann"]["toolkit"]["layout"] == "cann"
    assert [facts["cann"][c]["version"] for c in ("toolkit", "kernels", "nnal")] == ["8.5.0"] * 3
    assert not (node.install_path / "ascend-toolkit/8.3.RC1").exists()
    assert facts["scripts"] == [
        str(node.install_path / "cann-8.5.0/set_env.sh"),
        str(node.install_path / "nnal/atb/8.5.0/atb/set_env.sh"),
    ]
    assert ok(node.play("8.5.0"))["changed"] == 0
    back = node.play("8.3.RC1")
    ok(back)
    assert "going back from the 8.5 layout takes --uninstall of it, then --install" in " ".join(back.stdout.split())
    versions = node.facts()["cann"]["versions"]
    assert versions["8.3.RC1"]["toolkit"] == "8.3.RC1" and not (node.install_path / "cann-8.5.0").exists()


def _bundle_copy(bundle: Path, tmp_path: Path) -> Path:
    """A copy of the test bundle to tamper with (the manifest keeps the good digests)."""
    copy = tmp_path / "bundle"
    (copy / "cann").mkdir(parents=True)
    (copy / "manifest.json").write_bytes((bundle / "manifest.json").read_bytes())
    for path in (bundle / "cann").iterdir():
        (copy / "cann" / path.name).write_bytes(path.read_bytes())
    return copy


def test_tampered_package_is_refused_before_it_runs(node: Node, bundle: Path, tmp_path: Path) -> None:
    copy = _bundle_copy(bundle, tmp_path)
    toolkit = copy / "cann/Ascend-cann-toolkit_8.3.RC1_linux-x86_64.run"
    data = bytearray(toolkit.read_bytes())
    data[-50] ^= 0xFF
    toolkit.write_bytes(bytes(data))
    result = node.play("8.3.RC1", bundle=copy)
    assert result.returncode != 0
    assert str(toolkit) in result.stdout
    assert sha256(toolkit) in result.stdout and sha256(bundle / toolkit.relative_to(copy)) in result.stdout
    assert not (node.install_path / "ascend-toolkit").exists()


def test_bad_nnal_is_refused_before_the_toolkit_installs(node: Node, bundle: Path, tmp_path: Path) -> None:
    copy = _bundle_copy(bundle, tmp_path)
    nnal = copy / "cann/Ascend-cann-nnal_8.3.RC1_linux-x86_64.run"
    nnal.write_bytes(nnal.read_bytes()[:-10])  # truncated in transfer
    result = node.play("8.3.RC1", bundle=copy)
    assert result.returncode != 0
    assert "Refused before any installer ran" in result.stdout and str(nnal) in result.stdout
    assert not (node.install_path / "ascend-toolkit").exists(), "the toolkit installed alone"


def test_bad_version_fails_before_touching_the_node(node: Node) -> None:
    result = node.play("8.3")
    assert result.returncode != 0
    assert "is not a CANN release name" in result.stdout


def test_manifest_swapped_after_verification_is_refused_on_the_node(node: Node, bundle: Path, tmp_path: Path) -> None:
    copy = _bundle_copy(bundle, tmp_path)
    result = node.play("8.3.RC1", bundle=copy, verified="0" * 64)
    out = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert "is not the manifest whose signature was verified" in out and str(copy / "manifest.json") in out
    assert not (node.install_path / "ascend-toolkit").exists()


def test_a_file_planted_in_the_work_dir_never_runs(node: Node, bundle: Path) -> None:
    """The zip is unpacked afresh from its checked copy: what lay in the work directory is replaced, never run."""
    kernels = next((bundle / "cann").glob("*kernels*7.0.RC1*.zip"))
    stem = kernels.name.removesuffix(".zip")
    planted = node.tmp / "work" / stem / f"{stem}.run"
    planted.parent.mkdir(parents=True)
    planted.write_text("#!/bin/sh\necho planted\n")
    ok(node.play("7.0.RC1"))
    assert node.facts()["cann"]["kernels"]["version"] == "7.0.RC1"
    assert not planted.exists() and list((node.tmp / "work").iterdir()) == []


def test_an_installer_swapped_after_its_check_never_runs(node: Node, bundle: Path, tmp_path: Path) -> None:
    copy = _bundle_copy(bundle, tmp_path)
    bindir, pwned = swap_at_exec(tmp_path, copy, "cann/*.run")
    ok(node.play("8.3.RC1", bundle=copy, path=bindir))
    assert (copy / "cann/Ascend-cann-toolkit_8.3.RC1_linux-x86_64.run").read_text().startswith("#!/bin/sh\ntouch")
    assert not pwned.exists(), "a file swapped in the bundle after its check was run"
    facts = node.facts()["cann"]
    assert [facts[c]["version"] for c in ("toolkit", "kernels", "nnal")] == ["8.3.RC1"] * 3
    assert list((node.tmp / "work").iterdir()) == [], "the copies are removed after the install"


# Where a user other than root could change the bundle, the mode that lets them and how the refusal says it.
WRITABLE = [
    ("", 0o775, "mode 0775: writable by its group"),
    ("cann", 0o777, "mode 0777: writable by others"),
    ("cann/Ascend-cann-toolkit_8.3.RC1_linux-x86_64.run", 0o664, "mode 0664: writable by its group"),
    ("..", 0o770, "mode 0770: writable by its group"),
]
# Two of them judged in one run: the bundle's own directory (judged with the directories above it) and an installer
# in a directory that is fine (judged in the walk of the tree, which starts at the bundle whatever its own mode). Not
# merged: a writable cann/ (the walk does not go into it, so it would hide the installer) and the directory above the
# bundle (its fix is its own, no chown -R).
WRITABLE_IN_ONE_RUN = ("", "cann/Ascend-cann-toolkit_8.3.RC1_linux-x86_64.run")


def _writable_run(node: Node, bundle: Path, tmp: Path,
                  wheres: tuple[str, ...]) -> tuple[Path, subprocess.CompletedProcess]:
    copy = _bundle_copy(bundle, tmp)
    for where, mode, _ in WRITABLE:
        if where in wheres:
            ((copy / where).resolve() if where else copy).chmod(mode)
    return copy, node.play("8.3.RC1", bundle=copy)


@pytest.fixture(scope="module")
def writable_in_one_run(tmp_path_factory: pytest.TempPathFactory,
                        bundle: Path) -> tuple[Node, Path, subprocess.CompletedProcess]:
    """The run WRITABLE_IN_ONE_RUN's cases share (an ansible-playbook run costs seconds of CPU): each names only its
    own path in what it checks, so neither can pass on the other's refusal."""
    tmp = tmp_path_factory.mktemp("writable")
    node = Node(tmp, bundle)
    return node, *_writable_run(node, bundle, tmp, WRITABLE_IN_ONE_RUN)


@pytest.mark.parametrize(("where", "mode", "said"), WRITABLE)
def test_a_bundle_another_account_can_write_is_refused(request: pytest.FixtureRequest, bundle: Path, tmp_path: Path,
                                                       where: str, mode: int, said: str) -> None:
    if where in WRITABLE_IN_ONE_RUN:
        node, copy, result = request.getfixturevalue("writable_in_one_run")
    else:
        node = Node(tmp_path, bundle)
        copy, result = _writable_run(node, bundle, tmp_path, (where,))
    target = (copy / where).resolve() if where else copy
    out = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert f"localhost: bundle {copy}: a user other than root can change" in out
    assert f"{target}: owner root (0), group root (0), {said}" in out
    fix = (f"chown root:root {target} && chmod go-w {target}" if where == ".."
           else f"chown -R root:root {copy} && chmod -R go-w {copy}")
    assert f"fix: {fix}" in out
    assert not (node.install_path / "ascend-toolkit").exists()

"""Bundle sources for real sites: Huawei packages with vendor sums, per-target wheels, model
dirs, the suite, GPG signature; push target parsing. No network: pip resolves from a local dir."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from atlasctl import bundle, bundle_push, bundle_sources
from atlasctl import inventory as shared_inventory
from atlasctl.errors import UsageError


def _wheel(dirpath: Path, name: str, version: str, tag: str) -> Path:
    """A minimal valid wheel with the given platform tag."""
    fname = f"{name}-{version}-{tag}.whl"
    dist = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(dirpath / fname, "w") as zf:
        zf.writestr(f"{name}/__init__.py", "")
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(f"{dist}/WHEEL", f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n")
        zf.writestr(f"{dist}/RECORD", "")
    return dirpath / fname


@pytest.fixture
def huawei_dir(tmp_path: Path) -> Path:
    d = tmp_path / "downloads"
    d.mkdir()
    pkg = d / "Ascend-cann-toolkit_8.3.RC2_linux-aarch64.run"
    pkg.write_bytes(b"#!/bin/sh\nexit 0\n" + os.urandom(512))
    (d / (pkg.name + ".sha256")).write_text(hashlib.sha256(pkg.read_bytes()).hexdigest() + "  " + pkg.name + "\n")
    drv = d / "Ascend-hdk-910b-npu-driver_25.3.rc1_linux-aarch64.run"
    drv.write_bytes(b"driver")
    (d / (drv.name + ".md5")).write_text(hashlib.md5(b"driver").hexdigest() + "\n")
    return d


def _spec(tmp_path: Path, text: str) -> bundle.BundleSpec:
    path = tmp_path / "bundle.yml"
    path.write_text(text)
    return bundle.BundleSpec.load(path)


def test_site_spec_builds_huawei_pip_model_and_suite(tmp_path, huawei_dir):
    links = tmp_path / "links"
    links.mkdir()
    _wheel(links, "fakenpu", "1.0", "cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64")
    _wheel(links, "fakenpu", "1.0", "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64")
    _wheel(links, "fakenpu", "1.0", "cp310-cp310-manylinux_2_17_x86_64.manylinux2014_x86_64")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    driver_sha256 = hashlib.sha256(b"driver").hexdigest()  # its vendor ships an .md5 only: the spec pins it
    spec = _spec(tmp_path, f"""
name: site
arch: aarch64
huawei_dir: {huawei_dir}
huawei:
  - Ascend-cann-toolkit_8.3.RC2_linux-aarch64.run
  - {{name: Ascend-hdk-910b-npu-driver_25.3.rc1_linux-aarch64.run, sha256: {driver_sha256}}}
pip:
  - set: fakenpu-1.0
    requirements: [fakenpu==1.0]
    targets: [{{platform: manylinux2014_aarch64, python: "3.11"}}, {{platform: manylinux2014_x86_64, python: "3.11"}}]
    find_links: [{links}]
    no_index: true
models: [{{name: m, path: {model}}}]
suite: true
""")
    out = tmp_path / "out"
    manifest = bundle.build_bundle(spec, out, tmp_path / "cache")
    paths = {f["path"]: f for f in manifest["files"]}
    assert paths["cann/Ascend-cann-toolkit_8.3.RC2_linux-aarch64.run"]["version"] == "8.3.RC2"
    assert paths["hdk/Ascend-hdk-910b-npu-driver_25.3.rc1_linux-aarch64.run"]["kind"] == "driver"
    wheels = sorted(p.name for p in (out / "wheels/fakenpu-1.0").glob("*.whl"))
    assert wheels == ["fakenpu-1.0-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
                      "fakenpu-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"]
    assert "models/m/config.json" in paths
    assert "suite/site.yml" in paths and "suite/roles/cann/tasks/main.yml" in paths
    assert any(p.startswith("suite/collections/ansible_collections/atlas/serving/data/compat.yml") for p in paths)
    assert bundle.verify_bundle(out) == []


def test_pip_refuses_a_target_without_wheels(tmp_path):
    links = tmp_path / "links"
    links.mkdir()
    _wheel(links, "fakenpu", "1.0", "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64")
    step = bundle_sources.pip_step({"set": "s", "requirements": ["fakenpu==1.0"], "no_index": True,
                                       "find_links": [str(links)],
                                       "targets": [{"platform": "manylinux2014_aarch64", "python": "3.11"}]},
                                      tmp_path / "cache")
    with pytest.raises(UsageError, match="manylinux2014_aarch64 / Python 3.11"):
        step.run(tmp_path / "out")


def test_vendor_side_file_mismatch_is_refused(tmp_path, huawei_dir):
    pkg = huawei_dir / "Ascend-cann-toolkit_8.3.RC2_linux-aarch64.run"
    pkg.write_bytes(pkg.read_bytes()[:-1])
    step = bundle_sources.huawei_step(huawei_dir, pkg.name)
    with pytest.raises(UsageError, match=r"sha256 .* does not match the vendor's .*\.sha256"):
        step.run(tmp_path / "out")
    with pytest.raises(UsageError, match="Ascend-cann-\\* or Ascend-hdk-\\*"):
        bundle_sources.huawei_step(huawei_dir, "random.bin")


def test_a_huawei_package_nothing_vouches_for_is_refused(tmp_path, huawei_dir):
    """No .sha256 beside the package and no sha256 pinned in the spec: refused, naming the file and both fixes
    (an .md5 alone does not vouch); a pin is checked against the copy the bundle gets."""
    driver = "Ascend-hdk-910b-npu-driver_25.3.rc1_linux-aarch64.run"
    spec = tmp_path / "bundle.yml"
    spec.write_text(f"name: s\nhuawei_dir: {huawei_dir}\nhuawei: [{driver}]\n")
    out = tmp_path / "out"
    with pytest.raises(UsageError) as err:
        bundle.build_bundle(bundle.BundleSpec.load(spec), out, tmp_path / "cache")
    said = err.value.render()
    assert f"{huawei_dir / driver}: no {driver}.sha256 beside it and no sha256 pinned" in said
    assert f"put Huawei's {driver}.sha256 next to it" in said and "sha256: <the sha256" in said
    assert not out.exists()
    spec.write_text(f"name: s\nhuawei_dir: {huawei_dir}\nhuawei: [{{name: {driver}, sha256: {'ab' * 32}}}]\n")
    with pytest.raises(UsageError, match=r"sha256 \w+ does not match the sha256 pinned in the bundle spec"):
        bundle.build_bundle(bundle.BundleSpec.load(spec), out, tmp_path / "cache")
    assert not out.exists()
    right = hashlib.sha256(b"driver").hexdigest()
    spec.write_text(f"name: s\nhuawei_dir: {huawei_dir}\nhuawei: [{{name: {driver}, sha256: {right}}}]\n")
    manifest = bundle.build_bundle(bundle.BundleSpec.load(spec), out, tmp_path / "cache")
    assert [f["sha256"] for f in manifest["files"]] == [right]
    (huawei_dir / f"{driver}.sha256").write_text("not-a-digest\n")
    with pytest.raises(UsageError, match=f"{driver}.sha256: sha256 digest 'not-a-digest' is not 64 hex"):
        bundle.build_bundle(bundle.BundleSpec.load(spec), out, tmp_path / "cache")
    for entry in ("{name: x.run}", "{name: x.run, sha256: abc}", "{name: 1, sha256: x}", "[x]"):
        spec.write_text(f"name: s\nhuawei_dir: /x\nhuawei: [{entry}]\n")
        with pytest.raises(UsageError, match=r"huawei\[0\]"):
            bundle.BundleSpec.load(spec)


def test_push_targets_and_rsync_argv():
    data = {"all": {"children": ["atlas_nodes", "ungrouped"]},
            "atlas_nodes": {"children": ["east"]}, "east": {"hosts": ["n1"]},
            "_meta": {"hostvars": {"n1": {"ansible_host": "10.77.0.11", "ansible_user": "root",
                                          "ansible_ssh_private_key_file": "/k",
                                          "ansible_ssh_common_args": "-o StrictHostKeyChecking=yes"}}}}
    [target] = shared_inventory.targets(Path("inv"), document=data)
    argv = bundle_push.rsync_argv(Path("/b"), target, "/var/lib/atlas/bundle", part="files")
    assert "--partial-dir=.rsync-partial" in argv and "--delete" in argv
    assert argv[-2:] == ["/b/", "root@10.77.0.11:/var/lib/atlas/bundle/"]
    assert "/manifest.json" in argv
    rsh = argv[argv.index("--rsh") + 1]
    assert "-i /k" in rsh and "StrictHostKeyChecking=yes" in rsh
    with pytest.raises(UsageError, match="atlas_nodes"):
        shared_inventory.targets(Path("inv"), document={"_meta": {"hostvars": {}}})


@pytest.mark.parametrize("args", ["-o StrictHostKeyChecking=no", "-oStrictHostKeyChecking=no",
                                  "-o 'StrictHostKeyChecking no'"])
def test_push_refuses_what_doctor_refuses(args):
    """One source of SSH settings: an inventory that turns host keys off is refused by push as by doctor."""
    data = {"atlas_nodes": {"hosts": ["n1"]},
            "_meta": {"hostvars": {"n1": {"ansible_host": "10.0.0.1", "ansible_ssh_common_args": args}}}}
    with pytest.raises(UsageError, match="host key checking off"):
        shared_inventory.targets(Path("inv"), document=data)


def test_push_keeps_the_inventorys_own_ssh_options_but_never_relaxes_host_keys():
    hv = {"ansible_host": "10.0.0.1", "ansible_port": 2222,
          "ansible_ssh_common_args": "-o ProxyJump=bastion -o StrictHostKeyChecking=accept-new"}
    argv = shared_inventory.target("n1", hv).ssh_argv()
    assert argv.index("StrictHostKeyChecking=yes") < argv.index("StrictHostKeyChecking=accept-new")
    assert "ProxyJump=bastion" in argv and argv[argv.index("-p") + 1] == "2222"


def test_a_rebuilt_bundle_keeps_nothing_the_suite_no_longer_has(tmp_path):
    """The lab's profiles left roles/serving/vars/profiles/: a bundle refreshed in place must not keep them
    (its manifest would list them and the controller kit would install them beside the inventory's)."""
    from atlasctl.paths import suite_root

    out = tmp_path / "bundle"
    step = bundle_sources.suite_step(suite_root())
    step.run(out)
    stale = out / "suite/roles/serving/vars/profiles/lab-gone.yml"
    stale.write_text("__serving_profile: {}\n")
    step.run(out)
    assert not stale.exists()
    assert (out / "suite/site.yml").is_file() and (out / "suite/roles/serving/tasks/resolve.yml").is_file()

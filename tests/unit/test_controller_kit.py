"""The controller kit: its spec entry is checked when the spec loads, and its install command refuses a
kit that is not the signed bundle's before it installs anything."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from atlasctl.bundle import BundleSpec, plan_build, verify_bundle, write_manifest
from atlasctl.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "templates/controller/install.sh"
MODULE_UTILS = ROOT / "collections/ansible_collections/atlas/serving/plugins/module_utils"


def _spec(tmp_path: Path, controller: object) -> Path:
    path = tmp_path / "bundle.yml"
    path.write_text(json.dumps({"name": "b", "controller": controller}))
    return path


@pytest.mark.parametrize("entry, said", [
    ({}, "controller: needs targets"),
    ({"targets": []}, "controller: needs targets"),
    ({"targets": [{"platform": "manylinux2014_x86_64"}]},
     "needs platform (a wheel platform tag or a list of them) and python"),
    ({"targets": [{"platform": [], "python": "3.11"}]}, "needs platform"),
    ({"targets": [{"platform": [3], "python": "3.11"}]}, "needs platform"),
    ({"targets": [{"platform": "manylinux2014_x86_64", "python": 3.11}]}, "needs platform"),
    ({"targets": [{"platform": "x", "python": "3.11"}]}, "platform tag 'x' is not a Linux x86_64/aarch64 wheel tag"),
    ({"targets": [{"platform": ["manylinux2014_x86_64", "linux_aarch64"], "python": "3.11"}]},
     "mixes architectures"),
    ({"targets": [{"platform": "manylinux2014_x86_64", "python": "3.11"}], "wheel": 1},
     "controller wheel must be the path"),
    ({"targets": [{"platform": "manylinux2014_x86_64", "python": "3.11"}], "extra": 1}, "unknown key(s) extra"),
])
def test_a_bad_controller_entry_is_refused_when_the_spec_loads(tmp_path, entry, said):
    with pytest.raises(UsageError) as err:
        BundleSpec.load(_spec(tmp_path, entry))
    assert said in str(err.value) and str(tmp_path / "bundle.yml") in str(err.value)


def test_a_controller_kit_carries_the_suite_and_owns_its_files(tmp_path):
    spec = BundleSpec.load(_spec(tmp_path, {"targets": [{"platform": ["manylinux2014_x86_64"], "python": "3.11"}]}))
    steps = plan_build(spec, tmp_path / "cache")
    sources = [(p, s.source) for s in steps for p in s.owns]
    assert ("controller/wheels/atlasctl-*.whl", "suite") in sources and ("suite/*", "suite") in sources
    # write_manifest gives a file the source of the first pattern that matches: atlasctl's wheel is the suite's
    assert sources.index(("controller/wheels/atlasctl-*.whl", "suite")) < sources.index(("controller/*", "download"))


VERIFIER = "suite/collections/ansible_collections/atlas/serving/plugins/module_utils"


def _kit(root: Path) -> None:
    """A kit as a build writes it: install.sh, a wheel, the suite with the collection's verifier, and the
    bundle's manifest.json written by atlasctl.bundle.write_manifest (the one writer)."""
    (root / "controller/wheels").mkdir(parents=True)
    (root / VERIFIER).mkdir(parents=True)
    (root / "controller/wheels/a-1-py3-none-any.whl").write_bytes(b"wheel")
    (root / "suite/site.yml").write_text("---\n")
    (root / "controller/install.sh").write_bytes(INSTALL.read_bytes())
    for name in ("signature", "manifest", "checksums"):
        shutil.copy(MODULE_UTILS / f"{name}.py", root / VERIFIER / f"{name}.py")
    (root / "cann").mkdir()
    (root / "cann/not-the-kit.run").write_bytes(b"the kit's check is controller/ and suite/ only")
    write_manifest(root, "kit")


def _install(root: Path, prefix: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(root / "controller/install.sh"), str(prefix)], capture_output=True, text=True,
                          timeout=60, cwd=root)


def _rewrite(root: Path, edit) -> None:
    data = json.loads((root / "manifest.json").read_text())
    edit(data["files"])
    (root / "manifest.json").write_text(json.dumps(data))


@pytest.mark.parametrize("tamper, said", [
    (lambda r: (r / "controller/wheels/a-1-py3-none-any.whl").write_bytes(b"WHEEL"),
     "controller/wheels/a-1-py3-none-any.whl: sha256 mismatch: expected"),
    (lambda r: (r / "suite/site.yml").write_text("--- \n"), "suite/site.yml: size mismatch: expected 4, got 5"),
    (lambda r: (r / "controller/wheels/evil-1-py3-none-any.whl").write_bytes(b"x"),
     "controller/wheels/evil-1-py3-none-any.whl: not in the manifest"),
    (lambda r: (r / "suite/.hidden").write_bytes(b"x"), "suite/.hidden: not in the manifest"),
    (lambda r: (r / "suite/site.yml").unlink(), "suite/site.yml: missing"),
    (lambda r: ((r / "suite/site.yml").unlink(), (r / "suite/site.yml").symlink_to(r / "cann/not-the-kit.run")),
     "suite/site.yml: a symlink or special file, refused"),
    (lambda r: (r / "manifest.json").write_text("{"), "manifest.json is missing or unreadable"),
    (lambda r: _rewrite(r, lambda files: files.append(dict(files[-1]))), "is listed twice"),
    (lambda r: _rewrite(r, lambda files: [f.pop("size") for f in files if f["path"] == "suite/site.yml"]),
     "(suite/site.yml): no 'size' given"),
])
def test_install_refuses_a_kit_that_is_not_the_bundles_and_installs_nothing(tmp_path, tamper, said):
    root = tmp_path / "bundle"
    _kit(root)
    tamper(root)
    prefix = tmp_path / "prefix"
    run = _install(root, prefix)
    assert run.returncode != 0 and said in run.stderr and "nothing installed" in run.stderr, run.stderr
    assert not prefix.exists()


def test_install_runs_no_verifier_code_the_manifest_does_not_vouch_for(tmp_path):
    """The verifier comes from the kit: its bytes are checked against manifest.json before they run, and
    nothing is imported from the working directory (python3 -I)."""
    root = tmp_path / "bundle"
    _kit(root)
    marker = tmp_path / "ran"
    evil = f"open({str(marker)!r}, 'w').write('x')\n"
    checksums = root / VERIFIER / "checksums.py"
    checksums.write_text(evil + checksums.read_text())
    (root / "json.py").write_text(evil)  # the working directory of the install (cwd=root)
    run = _install(root, tmp_path / "prefix")
    assert run.returncode != 0 and f"the verifier {VERIFIER}/checksums.py is not the one" in run.stderr, run.stderr
    assert not marker.exists() and not (tmp_path / "prefix").exists()


def _damage(root: Path) -> None:
    (root / "controller/wheels/a-1-py3-none-any.whl").write_bytes(b"WHEEL")
    (root / "suite/site.yml").write_text("--- \n")
    (root / "controller/wheels/evil-1-py3-none-any.whl").write_bytes(b"x")
    (root / "suite/roles").mkdir()
    (root / "suite/roles/link").symlink_to(root / "suite/site.yml")
    (root / VERIFIER / "paths.py").write_text("")


def test_install_and_bundle_verify_give_the_same_verdicts(tmp_path):
    """One verifier: what install.sh refuses in the kit is exactly what `atlasctl bundle verify` reports."""
    root = tmp_path / "bundle"
    _kit(root)
    _damage(root)
    run = _install(root, tmp_path / "prefix")
    said = sorted(line.strip() for line in run.stderr.splitlines()[1:] if not line.strip().startswith("fix:"))
    assert run.returncode != 0 and said, run.stderr
    assert said == sorted(b.describe() for b in verify_bundle(root))


def test_install_passes_the_check_of_an_intact_kit(tmp_path):
    root = tmp_path / "bundle"
    _kit(root)
    prefix = tmp_path / "prefix"
    run = _install(root, prefix)
    if "cannot make a virtual environment" in run.stderr:
        pytest.skip("this machine's python3 has no venv/ensurepip")
    # the check passed: the install went on to the venv, and stopped at the missing atlasctl wheel
    assert "nothing installed" not in run.stderr and (prefix / "venv/bin/python").exists(), run.stderr

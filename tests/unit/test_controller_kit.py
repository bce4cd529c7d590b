"""The controller kit: its spec entry is checked when the spec loads, and its install command refuses a
kit that is not the signed bundle's before it installs anything."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from atlasctl.bundle import BundleSpec, plan_build
from atlasctl.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "templates/controller/install.sh"


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


def _kit(root: Path) -> None:
    (root / "controller/wheels").mkdir(parents=True)
    (root / "suite").mkdir()
    (root / "controller/wheels/a-1-py3-none-any.whl").write_bytes(b"wheel")
    (root / "suite/site.yml").write_text("---\n")
    (root / "controller/install.sh").write_bytes(INSTALL.read_bytes())
    files = [{"path": str(p.relative_to(root)), "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in sorted(root.rglob("*")) if p.is_file()]
    (root / "manifest.json").write_text(json.dumps({"files": files}))


@pytest.mark.parametrize("tamper, said", [
    (lambda r: (r / "controller/wheels/a-1-py3-none-any.whl").write_bytes(b"WHEEL"), "sha256 differs"),
    (lambda r: (r / "controller/wheels/evil-1-py3-none-any.whl").write_bytes(b"x"), "not in the manifest"),
    (lambda r: (r / "suite/site.yml").unlink(), "suite/site.yml (missing)"),
    (lambda r: (r / "manifest.json").write_text("{"), "manifest.json is missing or unreadable"),
])
def test_install_refuses_a_kit_that_is_not_the_bundles_and_installs_nothing(tmp_path, tamper, said):
    root = tmp_path / "bundle"
    _kit(root)
    tamper(root)
    prefix = tmp_path / "prefix"
    run = subprocess.run(["sh", str(root / "controller/install.sh"), str(prefix)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode != 0 and said in run.stderr, run.stderr
    assert not prefix.exists()

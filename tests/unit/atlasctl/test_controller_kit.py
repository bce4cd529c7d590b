"""The controller kit: its spec entry is checked when the spec loads, and its install command refuses a
kit that is not the signed bundle's before it installs anything."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from atlasctl.bundle import BundleSpec, plan_build, verify_bundle, write_manifest
from atlasctl.errors import UsageError
from support.gpg_keys import Keys

ROOT = Path(__file__).resolve().parents[3]
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
needs_gpg = pytest.mark.skipif(not (shutil.which("gpg") and shutil.which("gpgv")), reason="gpg/gpgv not installed")


@pytest.fixture(scope="module")
def release_key(tmp_path_factory: pytest.TempPathFactory):
    """The bank's release key (pinned) and someone else's (in the keyring too, never pinned), throwaway."""
    tmp = tmp_path_factory.mktemp("release-key")
    keys = Keys(tmp / "signing")
    pinned, other = keys.make("release@bank"), keys.make("someone@else")
    keyring = keys.export(tmp / "trusted.gpg", "release@bank", "someone@else")
    yield keys, pinned, other, keyring
    keys.close()


def _wheel(path: Path, name: str, version: str, scripts: dict[str, str]) -> None:
    """A pure-Python wheel pip installs (its console scripts print what the real ones would)."""
    dist = f"{name}-{version}.dist-info"
    module = name.replace("-", "_") + "_kit_double"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{module}.py", "".join(f"def {fn}():\n    print({out!r})\n" for fn, out in scripts.items()))
        wheel.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(f"{dist}/WHEEL",
                       "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{dist}/entry_points.txt", "[console_scripts]\n" + "".join(
            f"{script} = {module}:{fn}\n" for script, fn in (("atlasctl", "atlasctl"), ("ansible-galaxy", "galaxy"))
            if fn in scripts))
        wheel.writestr(f"{dist}/RECORD", "")


def _kit(root: Path, key=None, wheels: bool = False) -> None:
    """A kit as a build writes it: install.sh, a wheel, the suite with the collection's verifier, the bundle's
    manifest.json written by atlasctl.bundle.write_manifest (the one writer), signed by ``key`` (the release
    key fixture) when given. ``wheels``: wheels pip installs, standing in for atlasctl and ansible-core."""
    (root / "controller/wheels").mkdir(parents=True)
    (root / VERIFIER).mkdir(parents=True)
    if wheels:
        _wheel(root / "controller/wheels/atlasctl-9.9.9-py3-none-any.whl", "atlasctl", "9.9.9",
               {"atlasctl": "9.9.9 (kit double)", "galaxy": ""})
    else:
        (root / "controller/wheels/a-1-py3-none-any.whl").write_bytes(b"wheel")
    (root / "controller/atlas-serving-9.9.9.tar.gz").write_bytes(b"collection")
    (root / "suite/site.yml").write_text("---\n")
    (root / "controller/install.sh").write_bytes(INSTALL.read_bytes())
    for name in ("signature", "manifest", "fast_read", "checksums"):
        shutil.copy(MODULE_UTILS / f"{name}.py", root / VERIFIER / f"{name}.py")
    (root / "cann").mkdir()
    (root / "cann/not-the-kit.run").write_bytes(b"the kit's check is controller/ and suite/ only")
    write_manifest(root, "kit")
    if key is not None:
        key[0].sign(root, "release@bank")


def _install(root: Path, prefix: Path, key=None, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    pin = ["--keyring", str(key[3]), "--fingerprint", key[1]] if key is not None else []
    return subprocess.run(["sh", str(root / "controller/install.sh"), *pin, *args, str(prefix)], capture_output=True,
                          text=True, timeout=300, cwd=root, env=env)


def _rewrite(root: Path, edit, key) -> None:
    """The manifest edited, then signed by the pinned key: a signed manifest that is itself damaged."""
    data = json.loads((root / "manifest.json").read_text())
    edit(data["files"])
    (root / "manifest.json").write_text(json.dumps(data))
    key[0].sign(root, "release@bank")


@needs_gpg
@pytest.mark.parametrize("case, said", [
    ("unsigned", "manifest.json.asc is missing: manifest.json is NOT signed"),
    ("self-made", "BAD signature of manifest.json"),
    ("self-signed", "NOT pinned (--fingerprint): a manifest signed by anyone else"),
    ("stranger", "signed by a key that is not in"),
])
def test_install_refuses_an_unsigned_or_self_made_kit(tmp_path, release_key, case, said):
    """An attacker who can write the share replaces a wheel and writes a manifest to match: unsigned, beside the
    old signature, signed by another key of the keyring, or by a key of their own. Nothing is installed."""
    root = tmp_path / "bundle"
    _kit(root, release_key)
    (root / "controller/wheels/a-1-py3-none-any.whl").write_bytes(b"evil")
    write_manifest(root, "kit")
    if case == "unsigned":
        (root / "manifest.json.asc").unlink()
    elif case == "self-signed":
        release_key[0].sign(root, "someone@else")
    elif case == "stranger":
        stranger = Keys(tmp_path / "stranger")
        stranger.make("mallory@evil")
        stranger.sign(root, "mallory@evil")
        stranger.close()
    prefix = tmp_path / "prefix"
    run = _install(root, prefix, release_key)
    assert run.returncode == 1 and said in run.stderr and "nothing installed" in run.stderr, run.stderr
    assert not prefix.exists()


@needs_gpg
def test_install_needs_a_pinned_key_from_outside_the_bundle(tmp_path, release_key):
    root = tmp_path / "bundle"
    _kit(root, release_key)
    prefix = tmp_path / "prefix"
    run = _install(root, prefix)
    assert run.returncode == 2 and "no signing key is pinned" in run.stderr and "usage:" in run.stderr, run.stderr
    inside = root / "controller/trusted.gpg"  # a keyring the kit brings along
    shutil.copy(release_key[3], inside)
    run = _install(root, prefix, None, "--keyring", str(inside), "--fingerprint", release_key[1])
    assert run.returncode == 2 and "is inside the bundle" in run.stderr, run.stderr
    run = _install(root, prefix, None, "--keyring", str(release_key[3]), "--fingerprint", release_key[1][-16:])
    assert run.returncode == 2 and "not a full 40-hex fingerprint" in run.stderr, run.stderr
    assert not prefix.exists()


@needs_gpg
@pytest.mark.parametrize("tamper, said", [
    (lambda r, k: (r / "controller/wheels/a-1-py3-none-any.whl").write_bytes(b"WHEEL"),
     "controller/wheels/a-1-py3-none-any.whl: sha256 mismatch: expected"),
    (lambda r, k: (r / "suite/site.yml").write_text("--- \n"), "suite/site.yml: size mismatch: expected 4, got 5"),
    (lambda r, k: (r / "controller/wheels/evil-1-py3-none-any.whl").write_bytes(b"x"),
     "controller/wheels/evil-1-py3-none-any.whl: not in the manifest"),
    (lambda r, k: (r / "suite/.hidden").write_bytes(b"x"), "suite/.hidden: not in the manifest"),
    (lambda r, k: (r / "suite/site.yml").unlink(), "suite/site.yml: missing"),
    (lambda r, k: ((r / "suite/site.yml").unlink(), (r / "suite/site.yml").symlink_to(r / "cann/not-the-kit.run")),
     "suite/site.yml: a symlink or special file, refused"),
    (lambda r, k: ((r / "manifest.json").write_text("{"), k[0].sign(r, "release@bank")),
     "manifest.json is missing or unreadable"),
    (lambda r, k: _rewrite(r, lambda files: files.append(dict(files[-1])), k), "is listed twice"),
    (lambda r, k: _rewrite(r, lambda files: [f.pop("size") for f in files if f["path"] == "suite/site.yml"], k),
     "(suite/site.yml): no 'size' given"),
])
def test_install_refuses_a_kit_that_is_not_the_bundles_and_installs_nothing(tmp_path, release_key, tamper, said):
    root = tmp_path / "bundle"
    _kit(root, release_key)
    tamper(root, release_key)
    prefix = tmp_path / "prefix"
    run = _install(root, prefix, release_key)
    assert run.returncode != 0 and said in run.stderr and "nothing installed" in run.stderr, run.stderr
    assert not prefix.exists()


@needs_gpg
def test_install_runs_no_verifier_code_the_manifest_does_not_vouch_for(tmp_path, release_key):
    """The verifier comes from the kit: its bytes are checked against the verified manifest.json before they
    run, and nothing is imported from the working directory (python3 -I)."""
    root = tmp_path / "bundle"
    _kit(root, release_key)
    marker = tmp_path / "ran"
    evil = f"open({str(marker)!r}, 'w').write('x')\n"
    checksums = root / VERIFIER / "checksums.py"
    checksums.write_text(evil + checksums.read_text())
    (root / "json.py").write_text(evil)  # the working directory of the install (cwd=root)
    run = _install(root, tmp_path / "prefix", release_key)
    assert run.returncode != 0 and f"the verifier {VERIFIER}/checksums.py is not the one" in run.stderr, run.stderr
    assert not marker.exists() and not (tmp_path / "prefix").exists()


def _damage(root: Path) -> None:
    (root / "controller/wheels/a-1-py3-none-any.whl").write_bytes(b"WHEEL")
    (root / "suite/site.yml").write_text("--- \n")
    (root / "controller/wheels/evil-1-py3-none-any.whl").write_bytes(b"x")
    (root / "suite/roles").mkdir()
    (root / "suite/roles/link").symlink_to(root / "suite/site.yml")
    (root / VERIFIER / "paths.py").write_text("")


@needs_gpg
def test_install_and_bundle_verify_give_the_same_verdicts(tmp_path, release_key):
    """One verifier: what install.sh refuses in the kit is exactly what `atlasctl bundle verify` reports."""
    root = tmp_path / "bundle"
    _kit(root, release_key)
    _damage(root)
    run = _install(root, tmp_path / "prefix", release_key)
    said = sorted(line.strip() for line in run.stderr.splitlines()[2:] if not line.strip().startswith("fix:"))
    assert run.returncode != 0 and said, run.stderr
    assert said == sorted(b.describe() for b in verify_bundle(root))


GPGV_DOUBLE = """#!/bin/sh
# gpgv as the share's attacker would wish: the kit on the share is replaced right after install.sh copied it
printf 'echo evil\\n' > {root}/suite/site.yml
printf 'evil' > {root}/controller/wheels/atlasctl-9.9.9-py3-none-any.whl
exec {gpgv} "$@"
"""


@needs_gpg
def test_install_checks_and_installs_the_private_copy_with_hash_checked_wheels(tmp_path, release_key):
    """The kit is copied first; the share changed after the copy changes nothing that is checked or installed,
    and pip installs the wheels in hash-checking mode, the hashes from the verified manifest."""
    root = tmp_path / "bundle"
    _kit(root, release_key, wheels=True)
    doubles = tmp_path / "bin"
    doubles.mkdir()
    (doubles / "gpgv").write_text(GPGV_DOUBLE.format(root=root, gpgv=shutil.which("gpgv")))
    (doubles / "gpgv").chmod(0o755)
    prefix = tmp_path / "prefix"
    env = {**os.environ, "PATH": f"{doubles}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
    run = _install(root, prefix, release_key, env=env)
    if "cannot make a virtual environment" in run.stderr:
        pytest.skip("this machine's python3 has no venv/ensurepip")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "signed by a pinned key" in run.stderr and "installed: " in run.stdout and "9.9.9 (kit double)" in run.stdout
    assert (prefix / "suite/site.yml").read_text() == "---\n", "the share's file after the copy was installed"
    assert (root / "suite/site.yml").read_text() == "echo evil\n"  # the double did change the share
    assert list(tmp_path.glob("atlas-install.*")) == [], "the private copy is removed"
    assert "--require-hashes" in INSTALL.read_text()

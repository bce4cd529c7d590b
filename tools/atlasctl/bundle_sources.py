"""Real-world bundle sources (a connected build machine): Huawei packages from a local
download directory, pip wheels resolved per target platform and Python, model directories,
the suite itself, and an optional GPG detached signature of manifest.json.

Spec keys (bundle.yml; the lab's package adds its own, see atlasctl.bundle.SourceKind):

``huawei_dir`` + ``huawei``: directory the user downloaded into, and the file names to carry
    (``Ascend-cann-*`` -> ``cann/``, ``Ascend-hdk-*`` -> ``hdk/``); a vendor side file
    ``<name>.sha256`` / ``<name>.md5`` next to a package is checked before it is copied.
``pip``: list of ``{set, requirements, targets: [{platform, python}], find_links, no_index}``;
    each target runs ``pip download --only-binary=:all: --platform P --python-version V``
    into ``wheels/<set>/``.
``models`` entries with ``path``: a local model directory copied to ``models/<name>/``.
``suite: true``: playbooks/, roles/, collections/, site.yml, ansible.cfg and
    inventory/example-bank into ``suite/``.
``sign``: a GPG key id (``sign_home``: its gpg homedir); ``manifest.json.asc`` is written with
    ``gpg --detach-sign``.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from atlasctl.bundle import PlannedStep
from atlasctl.errors import EnvironmentProblem, UsageError

SUITE_ITEMS = ("playbooks", "roles", "collections", "site.yml", "ansible.cfg", "inventory/example-bank")


def _digest(path: Path, algo: str) -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as fh:
        while chunk := fh.read(8 * 2**20):
            h.update(chunk)
    return h.hexdigest()


def vendor_side_check(path: Path) -> None:
    """Check ``<name>.sha256`` / ``<name>.md5`` next to a vendor package, when present."""
    for algo in ("sha256", "md5"):
        side = path.with_name(path.name + f".{algo}")
        if not side.exists():
            continue
        words = side.read_text().split()
        want = words[0].lower() if words else ""
        have = _digest(path, algo)
        if want != have:
            raise UsageError(f"{path}: {algo} {have} does not match the vendor's {side.name} ({want})",
                             fix="download the package again from Huawei's support site")


def huawei_step(src_dir: Path, name: str) -> PlannedStep:
    sub = "hdk" if name.startswith("Ascend-hdk-") else "cann" if name.startswith("Ascend-cann-") else ""
    if not sub:
        raise UsageError(f"huawei package {name!r}: expected an Ascend-cann-* or Ascend-hdk-* file name")

    def run(out: Path) -> None:
        src = src_dir / name
        if src.is_symlink():
            raise UsageError(f"{src} is a symlink; a bundle is built from regular files only",
                             fix=f"copy the package itself into {src_dir}")
        if not src.is_file():
            raise UsageError(f"{src} does not exist", fix=f"download {name} into {src_dir} or fix huawei_dir")
        vendor_side_check(src)
        dest = out / sub / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not (dest.exists() and dest.stat().st_size == src.stat().st_size
                and dest.stat().st_mtime_ns == src.stat().st_mtime_ns):
            shutil.copy2(src, dest)

    return PlannedStep(f"huawei {name}", run, "vendor", (f"{sub}/{name}",))


def pip_download_argv(requirements: list[str], dest: Path, platform: str, python: str,
                      find_links: list[str], no_index: bool) -> list[str]:
    argv = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--platform", platform,
            "--python-version", python, "--dest", str(dest), "--disable-pip-version-check"]
    for link in find_links:
        argv += ["--find-links", link]
    if no_index:
        argv.append("--no-index")
    return [*argv, *requirements]


def pip_step(entry: dict) -> PlannedStep:
    name, reqs, targets = entry.get("set"), entry.get("requirements"), entry.get("targets")
    if not name or not isinstance(reqs, list) or not reqs or not isinstance(targets, list) or not targets:
        raise UsageError(f"pip entry {entry!r}: needs set, requirements (list) and targets "
                         "([{platform: manylinux2014_aarch64, python: '3.11'}])")
    for target in targets:
        if not isinstance(target, dict) or not target.get("platform") or not target.get("python"):
            raise UsageError(f"pip entry {name!r}: each target is a mapping with platform and python, not "
                             f"{target!r}", fix="write e.g. {platform: manylinux2014_aarch64, python: '3.11'}")

    def run(out: Path) -> None:
        dest = out / "wheels" / name
        dest.mkdir(parents=True, exist_ok=True)
        for target in targets:
            argv = pip_download_argv(reqs, dest, str(target["platform"]), str(target["python"]),
                                     [str(f) for f in entry.get("find_links", [])], bool(entry.get("no_index")))
            proc = subprocess.run(argv, text=True, capture_output=True, check=False)
            if proc.returncode != 0:
                raise UsageError(f"wheels {name} for {target['platform']} / Python {target['python']}: pip "
                                 f"could not resolve: {proc.stderr.strip()[-600:]}",
                                 fix="pin versions that publish wheels for that platform and Python")
        (dest / "requirements.txt").write_text("\n".join(reqs) + "\n")

    return PlannedStep(f"wheels {name}", run, "download", (f"wheels/{name}/*",))


def model_dir_step(model: dict) -> PlannedStep:
    name, src = model.get("name"), Path(str(model.get("path")))

    def run(out: Path) -> None:
        if not src.is_dir():
            raise UsageError(f"model {name}: {src} is not a directory", fix="fix the model's path in the spec")
        from atlasctl.bundle import scan_tree

        _files, links = scan_tree(src)
        if links:
            raise UsageError(f"model {name}: {src} holds symlinks or special files, not followed: "
                             f"{', '.join(links[:10])}", fix="copy the model with its files resolved (cp -rL, or "
                             "huggingface-cli download --local-dir) and point the spec there")
        shutil.copytree(src, out / "models" / name, dirs_exist_ok=True, copy_function=shutil.copy2)

    return PlannedStep(f"model {name} from {src}", run, "local-model", (f"models/{name}/*",))


def suite_step(repo: Path) -> PlannedStep:
    def run(out: Path) -> None:
        for item in SUITE_ITEMS:
            src, dest = repo / item, out / "suite" / item
            if src.is_dir():
                shutil.copytree(src, dest, dirs_exist_ok=True, copy_function=shutil.copy2,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
            elif src.is_file():
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest)

    return PlannedStep("suite (playbooks, roles, collection)", run, "suite", ("suite/*",))


def _gpg() -> str:
    gpg = shutil.which("gpg")
    if not gpg:
        raise EnvironmentProblem("gpg is not installed", fix="apt-get install gnupg gpgv")
    return gpg


def sign_manifest(root: Path, key: str, homedir: Path | None = None) -> Path:
    """Write manifest.json.asc, a detached armored signature by ``key`` (the signing station's gpg,
    or ``homedir``'s). Verification never uses this gpg state: see module_utils/signature.py."""
    from atlasctl.bundle import MANIFEST, SIGNATURE

    sig = root / SIGNATURE
    argv = [_gpg(), "--batch", "--yes", "--local-user", key, "--armor", "--detach-sign", "--output", str(sig)]
    if homedir:
        argv[1:1] = ["--homedir", str(homedir)]
    proc = subprocess.run([*argv, str(root / MANIFEST)], text=True, capture_output=True, check=False)
    if proc.returncode != 0:
        raise UsageError(f"gpg could not sign {root}/{MANIFEST} with key {key}: {proc.stderr.strip()[-400:]}",
                         fix="check the key id (gpg --list-secret-keys) and --homedir/--sign-home")
    return sig

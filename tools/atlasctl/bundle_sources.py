"""Real-world bundle sources (a connected build machine): Huawei packages from a local
download directory, pip wheels resolved per target platform and Python, model directories,
the suite itself, and an optional GPG detached signature of manifest.json.

Spec keys (bundle.yml; the lab's package adds its own, see atlasctl.bundle.SourceKind):

``huawei_dir`` + ``huawei``: directory the user downloaded into, and the file names to carry
    (``Ascend-cann-*`` -> ``cann/``, ``Ascend-hdk-*`` -> ``hdk/``), each a name or ``{name, sha256}``; the copy
    is checked against the vendor's side files ``<name>.sha256`` / ``<name>.md5`` next to the package and the
    pinned ``sha256``, and a package with neither a ``.sha256`` side file nor a pin is refused.
``pip``: list of ``{set, requirements, targets: [{platform, python}], engine, build, vendor_dir, vendor,
    find_links, no_index, index_url}``: an engine wheelhouse in ``wheels/<set>/`` resolved, gated by the
    compatibility table, downloaded and proven for each target platform (atlasctl.wheelhouse).
``models`` entries with ``path``: a local model directory copied to ``models/<name>/``.
``images``: list of ``{name, archive, variant, cann, engine_release}``: a container image archive (``podman save``
    or ``docker save`` output, OCI or docker-archive) copied to ``images/<name>.tar``, listed with its image id
    (the config digest read from the archive), the chip family its CANN is built for (``910b`` or ``a3``), that
    CANN and the engine release it runs (docs/containers.md).
``suite: true``: the suite (atlasctl.paths.SUITE_ITEMS: site.yml, playbooks/, roles/, the collection,
    ansible.cfg, templates/, inventory/example-bank) into ``suite/``.
``controller``: ``{targets: [{platform, python}], wheel}``: the controller kit in ``controller/`` (and the
    suite): the atlasctl wheel (built from the checkout, or ``wheel``), the atlas.serving collection tarball,
    every wheel of requirements-controller.txt for each target, and ``install.sh``, the one install command
    (no index, no network; DESIGN.md, "Installing").
``sign``: a GPG key id (``sign_home``: its gpg homedir); ``manifest.json.asc`` is written with
    ``gpg --detach-sign``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ansible_collections.atlas.serving.plugins.module_utils import checksums
from ansible_collections.atlas.serving.plugins.module_utils.signature import MANIFEST_NAME as MANIFEST
from ansible_collections.atlas.serving.plugins.module_utils.signature import SIGNATURE_NAME as SIGNATURE

from atlasctl.bundle_step import PlannedStep, check_no_foreign_links, scan_tree
from atlasctl.errors import EnvironmentProblem, UsageError
from atlasctl.inputs import read_text
from atlasctl.paths import SUITE_ITEMS, copy_items


def vendor_pins(path: Path, pinned_sha256: str | None = None) -> dict[str, list[tuple[str, str]]]:
    """What vouches for a vendor package: {algorithm: [(hex, who), ...]} from ``<name>.sha256`` / ``<name>.md5``
    beside it and the sha256 the spec pins. A package with neither a ``.sha256`` side file nor a pinned sha256
    is refused (an md5 alone does not vouch: collisions are cheap)."""
    from ansible_collections.atlas.serving.plugins.module_utils import manifest as fmt

    pins: dict[str, list[tuple[str, str]]] = {}
    for algo in ("sha256", "md5"):
        side = path.with_name(path.name + f".{algo}")
        if not (side.exists() or side.is_symlink()):
            continue
        words = read_text(side, "vendor checksum file",
                          fix="download it again from Huawei's support site").split()
        try:
            digest = fmt.normalize_digest(words[0] if words else "", algo, str(side))
        except fmt.ManifestError as exc:
            raise UsageError(str(exc), fix="download the side file again from Huawei's support site") from None
        pins.setdefault(algo, []).append((digest, f"the vendor's {side.name}"))
    if pinned_sha256:
        pins.setdefault("sha256", []).append((pinned_sha256, "the sha256 pinned in the bundle spec"))
    if "sha256" not in pins:
        raise UsageError(f"{path}: no {path.name}.sha256 beside it and no sha256 pinned in the bundle spec: nothing "
                         "vouches for this package",
                         fix=f"put Huawei's {path.name}.sha256 next to it, or pin it in the spec: huawei: "
                             f"[{{name: {path.name}, sha256: <the sha256 from Huawei's download page>}}]")
    return pins


def check_vendor_pins(copy: Path, source: Path, pins: dict[str, list[tuple[str, str]]]) -> None:
    """``copy`` (the bytes the bundle gets) against every pin of ``source`` (:func:`vendor_pins`): md5 and
    sha256 in one read (module_utils/checksums)."""
    have = checksums.hash_file(str(copy))
    for algo, entries in pins.items():
        for want, who in entries:
            if getattr(have, algo) != want:
                raise UsageError(f"{source}: {algo} {getattr(have, algo)} does not match {who} ({want})",
                                 fix="download the package again from Huawei's support site")


def huawei_step(src_dir: Path, name: str, sha256: str | None = None) -> PlannedStep:
    """``cann/<name>`` or ``hdk/<name>``: the package copied, then the copy checked against the vendor's side files
    and the spec's pinned ``sha256`` (:func:`vendor_pins`) before it takes its place in the bundle."""
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
        pins = vendor_pins(src, sha256)
        dest = out / sub / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists() and dest.stat().st_size == src.stat().st_size \
                and dest.stat().st_mtime_ns == src.stat().st_mtime_ns:
            check_vendor_pins(dest, src, pins)
            return
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=dest.parent)
        os.close(fd)
        try:
            shutil.copy2(src, tmp)
            check_vendor_pins(Path(tmp), src, pins)  # the bytes the bundle gets, not the source read again
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    return PlannedStep(f"huawei {name}", run, "vendor", (f"{sub}/{name}",))


def pip_step(entry: dict, cache: Path, canns: tuple[str, ...] = ()) -> PlannedStep:
    """wheels/<set>/: the set resolved, gated, downloaded and proven for each target (atlasctl.wheelhouse)."""
    from atlasctl import wheelhouse

    pipset = wheelhouse.parse_entry(entry)

    def run(out: Path) -> None:
        wheelhouse.build_set(pipset, out, cache, canns)

    return PlannedStep(f"wheels {pipset.name}", run, "download", (f"wheels/{pipset.name}/*",))


def model_dir_step(model: dict) -> PlannedStep:
    name, src = model.get("name"), Path(str(model.get("path")))

    def run(out: Path) -> None:
        if not src.is_dir():
            raise UsageError(f"model {name}: {src} is not a directory", fix="fix the model's path in the spec")
        files, links = scan_tree(src)
        if links:
            raise UsageError(f"model {name}: {src} holds symlinks or special files, not followed: "
                             f"{', '.join(links[:10])}", fix="copy the model with its files resolved (cp -rL, or "
                             "huggingface-cli download --local-dir) and point the spec there")
        check_no_foreign_links(src, files, f"model {name}: {src}")
        shutil.copytree(src, out / "models" / name, dirs_exist_ok=True, copy_function=shutil.copy2)

    return PlannedStep(f"model {name} from {src}", run, "local-model", (f"models/{name}/*",))


IMAGE_KEYS = ("name", "archive", "variant", "cann", "engine_release")
_IMAGE_EXAMPLE = ("write e.g. '- {name: vllm-ascend-0.11.0, archive: /srv/images/vllm-ascend-v0.11.0.tar, "
                  "variant: 910b, cann: 8.3.RC2, engine_release: vllm-ascend-0.11.0}'")
_RELEASE = re.compile(r"[a-z0-9][a-z0-9.+-]*-[0-9][A-Za-z0-9.+-]*")  # fullmatch


def check_images(path: Path, entries: list) -> None:
    """The spec's ``images`` entries: the five keys, each a string, a known variant, a CANN release name, an
    engine release named as the schemas name them (``vllm-ascend-0.11.0``), each name once."""
    from ansible_collections.atlas.serving.plugins.module_utils import cann
    from ansible_collections.atlas.serving.plugins.module_utils import manifest as fmt

    seen: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"bundle spec {path}: images[{index}]"
        keys = set(entry)
        if keys != set(IMAGE_KEYS):
            missing, unknown = sorted(set(IMAGE_KEYS) - keys), sorted(keys - set(IMAGE_KEYS))
            said = "; ".join(p for p in (f"missing {', '.join(missing)}" if missing else "",
                                         f"unknown {', '.join(unknown)}" if unknown else "") if p)
            raise UsageError(f"{where}: {said}", fix=_IMAGE_EXAMPLE)
        bad = [key for key in IMAGE_KEYS if not isinstance(entry[key], str) or not entry[key]]
        if bad:
            raise UsageError(f"{where}: {', '.join(bad)} must be non-empty strings (quote a version like '8.5.0')",
                             fix=_IMAGE_EXAMPLE)
        if entry["variant"] not in fmt.IMAGE_VARIANTS:
            raise UsageError(f"{where}: variant {entry['variant']!r} is not one of {', '.join(fmt.IMAGE_VARIANTS)}",
                             fix="910b for an image built for Atlas A2 (Ascend 910B), a3 for Atlas A3 (the image's "
                                 "tag says which: quay.io/ascend/vllm-ascend:<v> or <v>-a3)")
        if cann.version_key(entry["cann"]) is None:
            raise UsageError(f"{where}: cann {entry['cann']!r} is not a CANN release name (7.0.RC1, 8.3.RC2, 8.5.0)",
                             fix="write the CANN the image carries, as its tag or Dockerfile names it")
        if not _RELEASE.fullmatch(entry["engine_release"]):
            raise UsageError(f"{where}: engine_release {entry['engine_release']!r} is not <engine>-<version>",
                             fix="name the engine release as the serving profiles do, e.g. vllm-ascend-0.11.0 or "
                                 "sglang-0.5.6")
        if entry["name"] in seen:
            raise UsageError(f"{where}: image name {entry['name']!r} is listed twice", fix="give each image its name")
        seen.add(entry["name"])


def image_step(entry: dict, source: str = "local-image") -> PlannedStep:
    """``images/<name>.tar``: the archive copied (when its size or mtime differ), after its image id was read,
    so a file that is not one image in a format ``podman load`` reads is refused before it is copied. The lab
    plans its own images with this step (``source``: lab-double)."""
    from ansible_collections.atlas.serving.plugins.module_utils import manifest as fmt
    from ansible_collections.atlas.serving.plugins.module_utils import oci_archive as archive_fmt

    name, src = str(entry["name"]), Path(str(entry["archive"])).expanduser()
    rel = f"{fmt.IMAGE_DIR}/{name}{fmt.IMAGE_SUFFIX}"

    def run(out: Path) -> None:
        if src.is_symlink():
            raise UsageError(f"image {name}: {src} is a symlink; a bundle is built from regular files only",
                             fix=f"point archive at the file itself ({src.resolve()})")
        if not src.is_file():
            raise UsageError(f"image {name}: {src} does not exist", fix="save the image there (`podman save -o "
                             f"{src} IMAGE`) or fix the entry's archive")
        try:
            archive_fmt.image_id(str(src))
        except archive_fmt.ImageArchiveError as exc:
            raise UsageError(f"image {name}: {exc}") from None
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not (dest.exists() and dest.stat().st_size == src.stat().st_size
                and dest.stat().st_mtime_ns == src.stat().st_mtime_ns):
            shutil.copy2(src, dest)

    fields = {key: str(entry[key]) for key in ("variant", "cann", "engine_release")}
    return PlannedStep(f"image {name} from {src}", run, source, (rel,), {rel: fields})


def suite_step(repo: Path) -> PlannedStep:
    def run(out: Path) -> None:
        # A fresh copy each build: a file the suite no longer has (a profile moved to an inventory, a task file
        # removed) must not stay in the bundle, listed in its manifest and installed by the controller kit.
        shutil.rmtree(out / "suite", ignore_errors=True)
        copy_items(repo, out / "suite")  # the same suite the wheel carries (atlasctl.paths)

    return PlannedStep("suite (playbooks, roles, collection)", run, "suite", ("suite/*",))


CONTROLLER = "controller"
KIT_INSTALL = "templates/controller/install.sh"
CONTROLLER_REQUIREMENTS = "requirements-controller.txt"
# What a wheel is built from: the packaging files, the package and the suite it carries (setup.py).
_WHEEL_SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "tools/atlasctl", *SUITE_ITEMS)


def _has_setuptools(major: int) -> bool:
    import importlib.metadata

    try:
        return int(importlib.metadata.version("setuptools").split(".")[0]) >= major
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False


def atlasctl_wheel(checkout: Path, dest: Path) -> Path:
    """Build the atlasctl wheel from ``checkout`` into ``dest``: from a fresh copy of what it is made of,
    so nothing an earlier build left in build/ can slip into it."""
    import tempfile

    checkout, dest = Path(checkout), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="atlasctl-wheel-") as tmp:
        src = Path(tmp) / "src"
        copy_items(checkout, src, _WHEEL_SOURCES)
        built = Path(tmp) / "dist"
        # pip builds in an isolated environment (setuptools from the index) unless this one already has the
        # setuptools pyproject.toml asks for (make venv installs it): then the build needs no index
        no_isolation = ["--no-build-isolation"] if _has_setuptools(68) else []
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--disable-pip-version-check",
                               *no_isolation, "-w", str(built), str(src)], text=True, capture_output=True, check=False)
        if proc.returncode != 0:
            raise EnvironmentProblem(f"the atlasctl wheel did not build from {checkout}: "
                                     f"{(proc.stderr or proc.stdout).strip()[-800:]}",
                                     fix="pip needs setuptools>=68 (from the index, or --find-links)")
        [wheel] = built.glob("atlasctl-*.whl")
        target = dest / wheel.name
        shutil.copy2(wheel, target)
    return target


def collection_tarball(suite: Path, dest: Path) -> Path:
    """``ansible-galaxy collection build`` of the suite's atlas.serving into ``dest``
    (atlas-serving-<version>.tar.gz)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    galaxy = Path(sys.executable).parent / "ansible-galaxy"
    source = Path(suite) / "collections/ansible_collections/atlas/serving"
    proc = subprocess.run([str(galaxy if galaxy.exists() else "ansible-galaxy"), "collection", "build", "--force",
                           "--output-path", str(dest), str(source)], text=True, capture_output=True, check=False)
    if proc.returncode != 0:
        raise EnvironmentProblem(f"ansible-galaxy collection build failed: {(proc.stderr or proc.stdout)[-600:]}",
                                 fix="run the build from an environment with ansible-core (make venv)")
    [tarball] = dest.glob("atlas-serving-*.tar.gz")  # galaxy names it <namespace>-<name>-<version>
    tarball.chmod(0o644)
    return tarball


def check_controller(path: Path, entry: dict) -> None:
    """The spec's ``controller`` entry: targets checked as a pip set's are, an optional prebuilt wheel."""
    from atlasctl import wheelhouse

    fix = "write e.g. controller: {targets: [{platform: [manylinux2014_x86_64], python: '3.11'}]}"
    unknown = set(entry) - {"targets", "wheel"}
    if unknown:
        raise UsageError(f"bundle spec {path}: controller has unknown key(s) {', '.join(sorted(unknown))}", fix=fix)
    wheelhouse.parse_targets(f"bundle spec {path}: controller", entry.get("targets"))
    if "wheel" in entry and not isinstance(entry["wheel"], str):
        raise UsageError(f"bundle spec {path}: controller wheel must be the path of an atlasctl wheel", fix=fix)


def controller_steps(entry: dict, suite: Path, cache: Path) -> list[PlannedStep]:
    """The controller kit: what is the suite's (atlasctl's wheel, the collection tarball, install.sh) and
    what is downloaded (the pinned wheels of requirements-controller.txt per target)."""
    kit_wheels = f"{CONTROLLER}/wheels"

    def kit(out: Path) -> None:
        dest = out / CONTROLLER
        for old in [*dest.glob("wheels/atlasctl-*.whl"), *dest.glob("atlas-serving-*.tar.gz")]:
            old.unlink()
        if entry.get("wheel"):
            wheel = Path(str(entry["wheel"])).expanduser()
            if not wheel.is_file() or not wheel.name.startswith("atlasctl-") or wheel.suffix != ".whl":
                raise UsageError(f"controller wheel {wheel} is not an atlasctl wheel file",
                                 fix="build it with `make wheel` (dist/atlasctl-*.whl) or drop controller.wheel")
            (dest / "wheels").mkdir(parents=True, exist_ok=True)
            shutil.copy2(wheel, dest / "wheels" / wheel.name)
        else:
            from atlasctl.paths import checkout_root

            checkout = checkout_root()
            if checkout is None:
                raise UsageError("controller kit: this atlasctl is installed, not a checkout, so it cannot build "
                                 "its own wheel", fix="name the wheel in the spec (controller: {wheel: ...})")
            atlasctl_wheel(checkout, dest / "wheels")
        collection_tarball(suite, dest)
        shutil.copy2(suite / KIT_INSTALL, dest / "install.sh")
        (dest / "install.sh").chmod(0o755)

    def wheels(out: Path) -> None:
        import json

        from atlasctl import wheelhouse

        dest = out / kit_wheels
        dest.mkdir(parents=True, exist_ok=True)
        text = (suite / CONTROLLER_REQUIREMENTS).read_text(encoding="utf-8")
        reqs = [r for r in (line.split("#")[0].strip() for line in text.splitlines()) if r]
        # Downloads are kept in the cache, keyed by the pins and the targets: a rebuild needs no index.
        key = hashlib.sha256(json.dumps([reqs, entry["targets"]], sort_keys=True).encode()).hexdigest()[:16]
        kept = cache / "controller-wheels" / key
        if not (kept / ".complete").is_file():
            shutil.rmtree(kept, ignore_errors=True)
            kept.mkdir(parents=True)
            for target in wheelhouse.parse_targets("controller", entry["targets"]):
                # the pins are the whole closure (requirements-controller.txt), so no marker is evaluated here
                argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--disable-pip-version-check", *target.platform_args(), "--dest", str(kept)]
                proc = subprocess.run([*argv, *reqs], text=True, capture_output=True, check=False)
                if proc.returncode != 0:
                    raise UsageError(f"controller wheels for {target.label}: pip could not download the pins: "
                                     f"{proc.stderr.strip()[-600:]}",
                                     fix="pin versions that publish wheels for that platform and Python")
            (kept / ".complete").write_text(text, encoding="utf-8")
        wanted = {w.name for w in kept.glob("*.whl")}
        for old in dest.glob("*.whl"):  # a refreshed bundle keeps no wheel of an earlier pin
            if old.name not in wanted and not old.name.startswith("atlasctl-"):
                old.unlink()
        for wheel in kept.glob("*.whl"):
            if not (dest / wheel.name).is_file() or (dest / wheel.name).stat().st_size != wheel.stat().st_size:
                shutil.copy2(wheel, dest / wheel.name)

    return [PlannedStep("controller kit (atlasctl wheel, collection, install.sh)", kit, "suite",
                        (f"{kit_wheels}/atlasctl-*.whl", f"{CONTROLLER}/atlas-serving-*.tar.gz",
                         f"{CONTROLLER}/install.sh")),
            PlannedStep("controller wheels (requirements-controller.txt)", wheels, "download",
                        (f"{CONTROLLER}/*",))]


def _gpg() -> str:
    gpg = shutil.which("gpg")
    if not gpg:
        raise EnvironmentProblem("gpg is not installed", fix="apt-get install gnupg gpgv")
    return gpg


def sign_manifest(root: Path, key: str, homedir: Path | None = None, data: bytes | None = None) -> Path:
    """Write manifest.json.asc, a detached armored signature by ``key`` (the signing station's gpg,
    or ``homedir``'s) of ``data``: the manifest bytes the caller checked (else manifest.json, read here once);
    gpg reads them from its standard input, never the file again. Verification never uses this gpg state:
    see module_utils/signature.py."""
    from atlasctl.inputs import read_bytes

    if data is None:
        data = read_bytes(root / MANIFEST, "bundle manifest", fix="build the bundle first (atlasctl bundle build)")
    sig = root / SIGNATURE
    argv = [_gpg(), "--batch", "--yes", "--local-user", key, "--armor", "--detach-sign", "--output", str(sig)]
    if homedir:
        argv[1:1] = ["--homedir", str(homedir)]
    proc = subprocess.run(argv, input=data, capture_output=True, check=False)
    if proc.returncode != 0:
        said = proc.stderr.decode("utf-8", "replace").strip()[-400:]
        raise UsageError(f"gpg could not sign {root}/{MANIFEST} with key {key}: {said}",
                         fix="check the key id (gpg --list-secret-keys) and --homedir/--sign-home")
    return sig

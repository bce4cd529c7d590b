"""The lab's engine container images, built offline (no registry exists here): the lab's base root
filesystem (the same debootstrap tree the nodes run on) as one layer, and a virtual environment of one of the
bundle's wheelsets as a second, installed inside that root exactly as the engines stage installs it on a node
(``python3 -m venv``, then ``pip install --no-index --no-deps --find-links WHEELSET -r requirements.lock``).
The result is an OCI archive (:mod:`atlaslab.oci_image`) that the product's bundle carries as an ``images:``
entry (docs/containers.md) and a node loads with Podman and runs by its id.

Built images are cached under ``<cache>/images/`` by a key of everything that goes into them (the base's
hash, the wheelset's requirements.lock and wheel names and sizes, the venv's path, this builder's version): a
second ``atlas-lab bundle`` with nothing changed reuses the archive (hard link into the bundle).

The lab only: the product takes the image archive a site exports from its registry (``docker save``/``podman
save``, or Huawei's published images); it never builds one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from atlaslab import base, oci_image, paths
from atlaslab.proc import run

log = logging.getLogger(__name__)

BUILDER_VERSION = 1
WHEELS_IN_ROOT = "/mnt/atlas-wheels"  # the wheelset, bound into the build root (not the host) while pip runs


@dataclass(frozen=True)
class EngineImage:
    name: str  # the bundle's image name, e.g. sglang-standin-0.5.6
    wheelset: Path  # the bundle's wheels/<set>/ (requirements.lock and the wheels)
    venv: str  # where the environment lives in the image, e.g. /opt/atlas/engines/sglang-standin-0.5.6
    labels: Mapping[str, str]


def images_dir() -> Path:
    return paths.cache_dir() / "images"


def image_key(image: EngineImage, base_hash: str) -> str:
    """Everything that goes into the archive, hashed: the same key, the same bytes."""
    lock = (image.wheelset / "requirements.lock").read_bytes()
    wheels = sorted((p.name, p.stat().st_size) for p in image.wheelset.glob("*.whl"))
    blob = json.dumps({"base": base_hash, "lock": hashlib.sha256(lock).hexdigest(), "wheels": wheels,
                       "venv": image.venv, "labels": dict(sorted(image.labels.items())),
                       "builder": BUILDER_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def install_venv(root: Path, image: EngineImage) -> None:
    """The engines stage's install, inside ``root`` (chroot): venv, then pip with no index."""
    wheels = root / WHEELS_IN_ROOT.lstrip("/")
    wheels.mkdir(parents=True, exist_ok=True)
    run(["mount", "--bind", "-o", "ro", str(image.wheelset), str(wheels)], timeout=60)
    (root / "proc").mkdir(exist_ok=True)
    run(["mount", "-t", "proc", "proc", str(root / "proc")], timeout=60)
    try:
        run(["chroot", str(root), "python3", "-m", "venv", image.venv], timeout=300,
            fix="the lab's base root filesystem needs python3-venv (atlaslab.base.PACKAGES)")
        run(["chroot", str(root), f"{image.venv}/bin/pip", "install", "--no-index", "--no-deps", "--no-cache-dir",
             "--disable-pip-version-check", "--find-links", WHEELS_IN_ROOT,
             "--requirement", f"{WHEELS_IN_ROOT}/requirements.lock"], timeout=1800,
            fix=f"the wheelset {image.wheelset} must install with no index (atlas-lab bundle builds it)")
    finally:
        run(["umount", str(root / "proc")], check=False, timeout=60)
        run(["umount", str(wheels)], check=False, timeout=60)
    wheels.rmdir()


def build(image: EngineImage, *, install: Callable[[Path, EngineImage], None] = install_venv,
          base_root: Path | None = None, base_hash: str | None = None) -> oci_image.BuiltImage:
    """The image's OCI archive in the cache (built when absent); ``base_root``/``base_hash``: the unpacked base
    to use (default: the lab's, unpacked from its cached tarball)."""
    if base_root is None:
        built = base.build()
        base_root, base_hash = base.ensure_unpacked(built), built.hash
    key = image_key(image, base_hash or "")
    target = images_dir() / f"{image.name}-{key}.tar"
    if target.is_file():
        return oci_image.verify(target)
    images_dir().mkdir(parents=True, exist_ok=True)
    work = images_dir() / f".build-{image.name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    root = work / "root"
    log.warning("building the lab's container image %s (the base root filesystem and %s)", image.name,
                image.wheelset.name)
    try:
        root.mkdir(parents=True)
        run(["cp", "-a", f"{base_root}/.", str(root)], timeout=600)
        install(root, image)
        venv = root / image.venv.lstrip("/")
        config = oci_image.ImageConfig(
            env={"PATH": f"{image.venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                 "VIRTUAL_ENV": image.venv},
            labels=dict(image.labels))
        built = oci_image.build(work / "image.tar", [oci_image.Tree(base_root, "/", oci_image.ROOTFS_SKIP),
                                                     oci_image.Tree(venv, image.venv)],
                                config, ref_name=f"localhost/atlas/{image.name}:lab")
        os.replace(work / "image.tar", target)
        for old in images_dir().glob(f"{image.name}-*.tar"):
            if old != target:
                old.unlink()  # an older key of the same image
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return oci_image.verify(target)

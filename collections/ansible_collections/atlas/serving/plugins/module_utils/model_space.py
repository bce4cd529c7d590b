# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Room for a model version before it is staged, and whether it is staged as one copy on the node.

Staging writes a new version side by side (``<models home>/versions/<digest>/``) while the
current version stays on disk for a rollback; rsync hard-links files that ``current`` already
holds unchanged (``--link-dest``), and a rerun keeps what the version directory already has.
"Unchanged" is rsync's quick check with ``--times``: same size and same modification second as
the bundle's file (a new shard of the same size is copied).

One copy per node (docs/fleet-scale.md): where the bundle's model directory and the version are on
one mounted filesystem, rsync hard-links the bundle's files into the version too (``--link-dest`` of
the bundle's directory, with ``--perms``: a file whose mode is the version's ``0644``; another mode
is copied, so the engine's user can read what it runs). Those files cost no space. Where they are not
(a bundle on the site's mirror share, another disk), every file is a second copy, and the check says
so. So the bytes to write are the model's manifest entries that neither the version nor ``current``
holds unchanged and that are not hard-linked from the bundle, and they must fit in the free space of
the filesystem that will hold the version, with ``headroom`` to spare.
"""

from __future__ import annotations

import os
import re
import stat

from ansible_collections.atlas.serving.plugins.module_utils.manifest import load_manifest


def _same_file(path, source):
    """rsync's quick check (``--times``): a regular file of the same size and modification second."""
    try:
        st, src = os.lstat(path), os.stat(source)
    except OSError:
        return False
    return not os.path.islink(path) and st.st_size == src.st_size and int(st.st_mtime) == int(src.st_mtime)


# The models stage's file mode (rsync --chmod=F0644 with --perms): --link-dest links a file only with it.
LINK_MODE = 0o644


def mount_point(path):
    """The mount point of the mounted filesystem that holds ``path`` (or its nearest existing directory), from
    /proc/self/mountinfo: a hard link joins two names only within one mount, even one filesystem mounted twice
    (link(2), EXDEV). '' where the table cannot be read."""
    real = os.path.realpath(existing_ancestor(path))
    best = ""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) < 5:
                    continue
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best = point
    except OSError:
        return ""
    return best


def same_mount(a, b):
    """Whether a hard link can join a name under ``a`` and one under ``b``: one device and one mount."""
    try:
        if os.stat(existing_ancestor(a)).st_dev != os.stat(existing_ancestor(b)).st_dev:
            return False
    except OSError:
        return False
    return mount_point(a) == mount_point(b)


def _linkable(source):
    try:
        st = os.lstat(source)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == LINK_MODE


def bytes_to_write(expected, source_dir, version_dir, current_dir, link_source=False):
    """(total bytes of the model, bytes staging must write, bytes hard-linked from the bundle) for ``expected``
    {rel: Expected}: a file is not written when the version directory or ``current`` holds what rsync's quick
    check takes for the bundle's file (kept, or hard-linked by ``--link-dest``), nor, with ``link_source``
    (the bundle on the version's mount), when the bundle's own file can be hard-linked."""
    total = need = linked = 0
    for rel, exp in expected.items():
        size = exp.size or 0
        total += size
        source = os.path.join(source_dir, rel)
        if any(d and _same_file(os.path.join(d, rel), source) for d in (version_dir, current_dir)):
            continue
        if link_source and _linkable(source):
            linked += size
        else:
            need += size
    return total, need, linked


def existing_ancestor(path):
    """The nearest directory of ``path`` that exists (the filesystem the version will be on)."""
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def human(n):
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def check(manifest, model, version_dir, current_dir, headroom, free=free_bytes, source_dir=None, link=None):
    """The room check: a dict with need, free and ok; ``message`` says what is short, ``note`` that the model
    is staged as a second copy and why. ``source_dir``: the model in the bundle (default: models/<model> beside
    the manifest); ``link``: whether it is on the version's mount (default: found out, :func:`same_mount`)."""
    expected = load_manifest(manifest, prefix=f"models/{model}")
    source_dir = source_dir or os.path.join(os.path.dirname(manifest), "models", model)
    link = same_mount(source_dir, version_dir) if link is None else bool(link)
    total, need, linked = bytes_to_write(expected, source_dir, version_dir, current_dir, link_source=link)
    where = existing_ancestor(version_dir)
    available = free(where)
    result = {"model_bytes": total, "need_bytes": need, "linked_bytes": linked, "same_filesystem": link,
              "headroom_bytes": headroom, "free_bytes": available, "filesystem_of": where,
              "ok": need == 0 or need + headroom <= available, "message": "", "note": ""}
    if not link and need:
        result["note"] = (
            f"model {model}: the bundle ({source_dir}) is not on the filesystem of {where}, so staging writes a "
            f"second copy of {human(need)} there (one copy per node needs the bundle on the models filesystem: "
            "push it to a directory there, atlasctl bundle push --dest, then the version is hard-linked)")
    elif link and need:
        result["note"] = (f"model {model}: {human(need)} of its files do not have mode 0644 in the bundle and are "
                          "copied, not hard-linked")
    if not result["ok"]:
        result["message"] = (
            f"no room to stage model {model} in {version_dir}: it needs {human(need)} (plus {human(headroom)} "
            f"headroom; the current version stays on disk for a rollback) and the filesystem of {where} has "
            f"{human(available)} free. Free space there, or put models_root on a larger filesystem, then run the "
            "models stage again.")
    return result

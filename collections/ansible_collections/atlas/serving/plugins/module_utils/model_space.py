# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Room for a model version before it is staged.

Staging writes a new version side by side (``<models home>/versions/<digest>/``) while the
current version stays on disk for a rollback; rsync hard-links files that ``current`` already
holds unchanged (``--link-dest``), and a rerun keeps what the version directory already has.
"Unchanged" is rsync's quick check with ``--times``: same size and same modification second as
the bundle's file (a new shard of the same size is copied). So the bytes to write are the
model's manifest entries that neither holds unchanged, and they must fit in the free space of
the filesystem that will hold the version, with ``headroom`` to spare.
"""

from __future__ import annotations

import os

from ansible_collections.atlas.serving.plugins.module_utils.manifest import load_manifest


def _same_file(path, source):
    """rsync's quick check (``--times``): a regular file of the same size and modification second."""
    try:
        st, src = os.lstat(path), os.stat(source)
    except OSError:
        return False
    return not os.path.islink(path) and st.st_size == src.st_size and int(st.st_mtime) == int(src.st_mtime)


def bytes_to_write(expected, source_dir, version_dir, current_dir):
    """(total bytes of the model, bytes staging must write) for ``expected`` {rel: Expected}: a file
    is not written when the version directory or ``current`` holds what rsync's quick check takes
    for the bundle's file (kept, or hard-linked by ``--link-dest``)."""
    total = need = 0
    for rel, exp in expected.items():
        size = exp.size or 0
        total += size
        source = os.path.join(source_dir, rel)
        if not any(d and _same_file(os.path.join(d, rel), source) for d in (version_dir, current_dir)):
            need += size
    return total, need


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


def check(manifest, model, version_dir, current_dir, headroom, free=free_bytes, source_dir=None):
    """The room check: a dict with need, free and ok; ``message`` says what is short.
    ``source_dir``: the model in the bundle (default: models/<model> beside the manifest)."""
    expected = load_manifest(manifest, prefix=f"models/{model}")
    source_dir = source_dir or os.path.join(os.path.dirname(manifest), "models", model)
    total, need = bytes_to_write(expected, source_dir, version_dir, current_dir)
    where = existing_ancestor(version_dir)
    available = free(where)
    result = {"model_bytes": total, "need_bytes": need, "headroom_bytes": headroom, "free_bytes": available,
              "filesystem_of": where, "ok": need == 0 or need + headroom <= available, "message": ""}
    if not result["ok"]:
        result["message"] = (
            f"no room to stage model {model} in {version_dir}: it needs {human(need)} (plus {human(headroom)} "
            f"headroom; the current version stays on disk for a rollback) and the filesystem of {where} has "
            f"{human(available)} free. Free space there, or put models_root on a larger filesystem, then run the "
            "models stage again.")
    return result

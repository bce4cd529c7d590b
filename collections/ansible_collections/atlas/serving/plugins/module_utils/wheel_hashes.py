# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A wheelhouse's ``requirements.lock`` with the sha256 of each wheel from the verified manifest: what
the engines stage installs with ``pip install --require-hashes``.

A lock pins each project once (``name==version``, with a marker where not every target platform
installs it: atlasctl.wheelhouse ``merged_lock``). Every wheel of the wheelhouse with that name and
version (one per target platform, a metadata-only one included) adds a ``--hash=sha256:<hex>`` from the
manifest, so pip installs a wheel only when the bytes it reads have one of them: pip's hash-checking
mode ("Secure installs", https://pip.pypa.io/en/stable/topics/secure-installs/). The lock itself must be
the manifest's: its bytes are checked here, before its pins are read. A pin without a wheel is refused.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import hashlib
import re

LOCK = "requirements.lock"
WHEEL_SUFFIX = ".whl"
# name-version[-build]-python-abi-platform.whl (the wheel file name convention, PEP 427)
_WHEEL = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^-]+)(?:-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*(?P<version>[^\s;]+)\s*(?:;.*)?$")


class LockError(ValueError):
    """A lock that cannot be installed with hashes; the message names the file, the line and the fix."""


def canonical(name: str) -> str:
    """A project name as pip compares it (PEP 503): ``Torch_NPU`` -> ``torch-npu``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def hashed_requirements(lock: bytes, lock_sha256: str, wheels: dict[str, str], source: str) -> str:
    """The lock's pins, each followed by the ``--hash`` of every wheel of ``wheels`` ({file name: sha256,
    the manifest's}) with its name and version. ``lock`` must have ``lock_sha256`` (the manifest's)."""
    fix = "rebuild the bundle (atlasctl bundle build) and copy it again"
    actual = hashlib.sha256(lock).hexdigest()
    if actual != lock_sha256:
        raise LockError(f"{source}: sha256 {actual} is not the manifest's {lock_sha256 or '(none)'}; nothing was "
                        f"installed; {fix}")
    hashes: dict[tuple[str, str], set[str]] = {}
    for filename, digest in wheels.items():
        match = _WHEEL.match(filename)
        if not match:
            raise LockError(f"{source}: {filename} in the wheelhouse is not a wheel file name "
                            "(name-version[-build]-python-abi-platform.whl); " + fix)
        hashes.setdefault((canonical(match["name"]), match["version"].lower()), set()).add(digest)
    lines = []
    for number, raw in enumerate(lock.decode("utf-8", "replace").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _PIN.match(line)
        if not match:
            raise LockError(f"{source} line {number}: {raw.strip()!r} is not a pin (name==version); {fix}")
        digests = hashes.get((canonical(match["name"]), match["version"].lower()))
        if not digests:
            raise LockError(f"{source} line {number}: no wheel of {match['name']}=={match['version']} in the "
                            f"wheelhouse the manifest lists; {fix}")
        lines.append(" ".join([line] + [f"--hash=sha256:{d}" for d in sorted(digests)]))
    if not lines:
        raise LockError(f"{source}: pins nothing; {fix}")
    return "".join(f"{line}\n" for line in lines)

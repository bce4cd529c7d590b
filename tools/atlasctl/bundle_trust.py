"""Who may sign a bundle: the inventory's trust variables, read the way Ansible reads them.

``atlas_bundle_trusted_fingerprints`` (full 40-hex fingerprints), ``atlas_bundle_keyring`` (a
public keyring file on the controller) and the loud opt-out ``atlas_bundle_allow_unsigned``
(alias ``bundle_allow_unsigned``). The playbooks read the same names (roles/bundle_trust);
``atlasctl bundle verify|push -i INV`` and ``atlasctl doctor`` read them here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from atlasctl import inventory as shared
from atlasctl.errors import UsageError

FINGERPRINTS_VAR = "atlas_bundle_trusted_fingerprints"
KEYRING_VAR = "atlas_bundle_keyring"
ALLOW_UNSIGNED_VAR = "atlas_bundle_allow_unsigned"
ALLOW_UNSIGNED_ALIAS = "bundle_allow_unsigned"  # the short spelling, accepted too


@dataclasses.dataclass(frozen=True)
class Trust:
    keyring: str
    fingerprints: tuple[str, ...]
    allow_unsigned: bool


as_bool = shared.as_bool


def allow_unsigned(hostvars: dict[str, Any]) -> bool:
    return as_bool(hostvars.get(ALLOW_UNSIGNED_VAR, hostvars.get(ALLOW_UNSIGNED_ALIAS, False)))


def of_host(hostvars: dict[str, Any]) -> Trust:
    fingerprints = hostvars.get(FINGERPRINTS_VAR) or []
    if isinstance(fingerprints, str):
        fingerprints = [fingerprints]
    return Trust(str(hostvars.get(KEYRING_VAR) or ""), tuple(str(f) for f in fingerprints),
                 allow_unsigned(hostvars))


def from_inventory(inventory: Path, limit: str | None = None) -> Trust:
    """The one trust setting of the inventory's serving hosts (hosts that disagree are refused)."""
    data = shared.listing(inventory, limit)
    hostvars = shared.hostvars(data)
    names = sorted(shared.group_hosts(data, shared.SERVING_GROUP))
    if not names:
        raise UsageError(f"inventory {inventory} has no host in group {shared.SERVING_GROUP}",
                         fix="pass --keyring and --fingerprint instead")
    found = {name: of_host(hostvars.get(name) or {}) for name in names}
    distinct = set(found.values())
    if len(distinct) > 1:
        raise UsageError(f"inventory {inventory}: the hosts disagree on {FINGERPRINTS_VAR}/{KEYRING_VAR}/"
                         f"{ALLOW_UNSIGNED_VAR}", fix="set them once, in group_vars/all, or use --limit")
    trust = distinct.pop()
    if "{{" in trust.keyring:
        raise UsageError(f"inventory {inventory}: {KEYRING_VAR} is a template ({trust.keyring})",
                         fix="give it as an absolute path, or pass --keyring")
    return trust

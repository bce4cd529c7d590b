"""Shipped inventories parse with ansible-inventory and carry no secrets."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
INVENTORY = Path(sys.executable).parent / "ansible-inventory"


def _inventory(path: str) -> dict:
    out = subprocess.run([str(INVENTORY), "-i", path, "--list"], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=120)
    return json.loads(out.stdout)


def test_example_bank_has_twelve_branches_canary_and_gateways():
    inv = _inventory("inventory/example-bank")
    branches = [g for g in inv if g.startswith("branch_")]
    assert len(branches) == 12
    for group in branches:
        assert len(inv[group]["hosts"]) == 2, group
    assert inv["canary"]["hosts"] == ["atlas-central-01"]
    assert len(inv["gateway"]["hosts"]) == 12
    assert set(inv["atlas_nodes"]["children"]) == set(branches)


def test_no_passwords_in_shipped_inventories():
    pattern = re.compile(r"(ansible_(ssh_)?pass(word)?|ansible_become_pass(word)?)\s*:", re.I)
    offenders = [str(p) for p in (ROOT / "inventory").rglob("*.yml") if pattern.search(p.read_text())]
    assert offenders == []


def test_example_bank_profile_is_shipped():
    main = (ROOT / "inventory/example-bank/group_vars/all/main.yml").read_text()
    profile = re.search(r"^serving_profile:\s*(\S+)", main, re.M).group(1)
    assert (ROOT / "roles/serving/vars/profiles" / f"{profile}.yml").exists()


def test_api_key_comes_from_vault_variable():
    main = (ROOT / "inventory/example-bank/group_vars/all/main.yml").read_text()
    assert re.search(r'^serving_api_key: "\{\{ vault_serving_api_key \}\}"$', main, re.M)


def test_example_bank_pins_a_placeholder_that_refuses_until_replaced():
    from ansible_collections.atlas.serving.plugins.module_utils import signature as sig

    hostvars = _inventory("inventory/example-bank")["_meta"]["hostvars"]["atlas-central-01"]
    assert hostvars["atlas_bundle_trusted_fingerprints"] == [sig.PLACEHOLDER_FINGERPRINT]
    assert hostvars["atlas_bundle_keyring"].startswith("/")
    assert not hostvars.get("atlas_bundle_allow_unsigned")
    try:
        sig.normalize_fingerprints(hostvars["atlas_bundle_trusted_fingerprints"])
    except sig.SignatureError as exc:
        assert "PLACEHOLDER" in str(exc)
    else:
        raise AssertionError("the placeholder fingerprint was accepted")


def test_lab_and_scale_inventories_carry_their_profiles_and_compatibility_rows():
    """Each inventory's own data resolves beside it (relative to its directory), as the roles resolve it:
    the scale lab links the lab's, so the profiles its nodes name are found and its engines are in the table."""
    import yaml
    from ansible_collections.atlas.serving.plugins.module_utils import compat
    from ansible_collections.atlas.serving.plugins.plugin_utils import site_data as site

    for inventory, groups in (("inventory/lab", ("branch_east", "branch_west")), ("inventory/scale", ("atlas_nodes",))):
        base = ROOT / inventory
        common = yaml.safe_load((base / "group_vars/all.yml").read_text())
        dirs = site.resolve_paths(common["serving_profile_dirs"], "serving_profile_dirs", str(base))
        table = site.load_compat("", site.resolve_paths(common["atlas_compat_extra_tables"],
                                                        "atlas_compat_extra_tables", str(base)))
        for group in groups:
            hv = common | yaml.safe_load((base / "group_vars" / f"{group}.yml").read_text())
            found = site.find_profile(hv["serving_profile"], dirs, str(ROOT / "roles/serving/vars/profiles"))
            assert Path(found).resolve().parent == ROOT / "inventory/lab/profiles", (inventory, group)
            plan = {"cann": hv["cann_version"], "engine": hv["engines_name"], "engine_version": hv["engines_version"]}
            assert compat.evaluate(plan, table)["lab"], (inventory, group)

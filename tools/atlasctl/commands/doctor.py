"""`atlasctl doctor -i INV`: diagnose the serving fleet over SSH, each finding with evidence and fix.

Checks: NPU visible (npu-smi, driver loaded), NPU health, NPU count vs tensor parallel size, HBM
use vs the profile's memory fraction, service state and /health, CANN environment in the engine's
process, the env file's variables (fictional ones, ASCEND_DEVICE_ID given a list), env file mode,
API key enforced, out-of-memory messages in the journal, driver/CANN/engine versions, model
stamp missing or stale; a hung instance (on an entry or single node: two /metrics samples
--hang-window seconds apart while a 1-token completion runs with that deadline, judged as the health
probe judges them: hung is an error, slow a warning); the API keys file (the engine's --config) readable
by no one but root and the serving account; the bundle on the node (atlas_bundle_dir) signed by a key the
inventory pins (atlas_bundle_keyring, atlas_bundle_trusted_fingerprints; checked on this machine with gpg);
from the inventory: the bundle's signature check turned off (atlas_bundle_allow_unsigned) or no signing key
pinned.
"""

from __future__ import annotations

import argparse

from atlasctl import bundle_trust
from atlasctl import inventory as shared
from atlasctl.doctor import checks, gather, inventory, report
from atlasctl.inputs import whole_number
from atlasctl.planner import default_vars
from atlasctl.runner import resolve_inventory
from atlasctl.site_data import compat_tables

# The whole gather of a host must fit its SSH command's timeout (atlasctl.doctor.inventory.ssh_run, 90 s).
MAX_HANG_WINDOW_S = 60.0
# Hosts diagnosed at once: a thread and an SSH connection each (a few file descriptors; the soft limit is
# often 1024).
MAX_WORKERS = 256

EPILOG = ("exit status: 0 healthy (warnings allowed), 1 a finding of severity error, "
          "3 a host could not be reached (named in the output), 2 bad command line or inventory")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("doctor", help="diagnose the serving fleet (evidence and fix per fault)",
                            description=__doc__, epilog=EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--inventory", required=True, help="inventory path (e.g. inventory/lab)")
    parser.add_argument("-l", "--limit", default=None, help="host pattern (as ansible --limit)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--workers", type=int, default=16,
                        help=f"hosts diagnosed at once (default 16, at most {MAX_WORKERS})")
    parser.add_argument("--hang-window", type=hang_window, default=10.0, metavar="SECONDS",
                        help="seconds between the two /metrics samples of the hang check, also the deadline "
                             f"of its completion (default 10; 0 turns it off; at most {MAX_HANG_WINDOW_S:g})")
    parser.set_defaults(func=run)


def hang_window(text: str) -> float:
    """--hang-window: seconds in [0, MAX_HANG_WINDOW_S]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= MAX_HANG_WINDOW_S:
        raise argparse.ArgumentTypeError(f"{value:g} is not between 0 (off) and {MAX_HANG_WINDOW_S:g} seconds "
                                         "(the gather of a host must fit its 90 s SSH command)")
    return value


def serving_account(hostvars: dict) -> tuple[str, str]:
    """The host's serving user and group (serving_user, serving_group; the serving role's defaults)."""
    defaults = default_vars()
    return (str(hostvars.get("serving_user") or defaults["serving_user"]),
            str(hostvars.get("serving_group") or defaults["serving_group"]))


def run(args: argparse.Namespace) -> int:
    whole_number(args.workers, "doctor --workers", 1, MAX_WORKERS, fix="leave it out (16 hosts at once)")
    inv = resolve_inventory(args.inventory)
    listing = shared.listing(inv, args.limit)
    targets = inventory.load(inv, args.limit, document=listing)
    ctx = checks.default_context(compat_tables(inv, listing))
    hostvars = shared.hostvars(listing)
    extra = [f for t in targets for f in checks.check_bundle_trust(t.name, hostvars.get(t.name) or {})]
    evidence, unreachable, seconds = gather.gather_all(targets, inventory.ssh_run, workers=args.workers,
                                                       hang_window_s=args.hang_window)
    unusable = {f.host for f in extra if f.severity == checks.ERROR}  # no key pinned: said once, not per check
    for name, ev in sorted(evidence.items()):  # the checks that judge a node's evidence with its inventory vars
        hv = hostvars.get(name) or {}
        if name not in unusable:
            extra += checks.check_bundle_signed(ev, bundle_trust.of_host(hv))
        extra += checks.check_keys_file(ev, *serving_account(hv))
    result = report.build([t.name for t in targets], evidence, unreachable, ctx, seconds, extra=extra)
    print(report.render_json(result) if args.json else report.render_text(result))
    return result.exit_code

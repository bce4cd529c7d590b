"""`atlasctl evidence verify|show DIR`: a rollout's evidence pack (docs/evidence.md).

verify: the signature of SHA256SUMS by the pinned key, every file it lists, and no file it does not list.
Exit status: 0 the pack is intact and signed by the pinned key (or unsigned, with --allow-unsigned);
1 anything changed, missing, extra, unsigned or signed by another key (one line each, naming the file);
2 bad input (no such pack, no key to check it against).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from atlasctl import evidence, exitcodes
from atlasctl.errors import UsageError
from atlasctl.runner import resolve_inventory


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("evidence", help="verify and show a rollout's evidence pack",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    esub = parser.add_subparsers(dest="evidence_command", metavar="ACTION", required=True)

    verify = esub.add_parser("verify", help="check a pack's signature and every file it lists")
    verify.add_argument("dir", type=Path, help="the pack (<report>.evidence beside a rollout's report)")
    verify.add_argument("-i", "--inventory", default=None,
                        help="check against the key this inventory names (atlas_evidence_signing_key, its public "
                             "part from atlas_evidence_gnupg_home)")
    verify.add_argument("--keyring", type=Path, default=None,
                        help="public keyring file holding the controller's evidence key (gpg --export)")
    verify.add_argument("--fingerprint", default="", metavar="FPR",
                        help="full 40-hex fingerprint of the controller's evidence key")
    verify.add_argument("--allow-unsigned", action="store_true",
                        help="accept a pack without a signature (reported loudly); its files are still checked")
    verify.add_argument("--json", action="store_true", help="print the result as JSON")
    verify.set_defaults(func=_verify)

    show = esub.add_parser("show", help="print a pack as a table, as JSON, or as an HTML page")
    show.add_argument("dir", type=Path, help="the pack")
    show.add_argument("--json", action="store_true", help="print the record (evidence.json) as JSON")
    show.add_argument("--html", type=Path, default=None, metavar="FILE",
                      help="also write a self-contained HTML page an auditor reads without the suite")
    show.set_defaults(func=_show)


def _verify(args: argparse.Namespace) -> int:
    if args.inventory and (args.keyring or args.fingerprint):
        raise UsageError("-i and --keyring/--fingerprint are two ways to name the key: pass one",
                         fix=evidence.KEY_FIX)
    if args.inventory:
        verdict = evidence.verify_with_inventory(args.dir, resolve_inventory(args.inventory), args.allow_unsigned)
    else:
        verdict = evidence.verify(args.dir, keyring=args.keyring, fingerprint=args.fingerprint,
                                  allow_unsigned=args.allow_unsigned)
    if args.json:
        print(json.dumps(verdict.as_dict(), indent=2, sort_keys=True))
    for name, problem in verdict.problems:
        print(f"{args.dir / name}: {problem}", file=sys.stderr)
    if verdict.ok and not args.json:
        if verdict.signed_by:
            who = f"signed by {verdict.signed_by}"
        elif verdict.unsigned:
            who = "!!! UNSIGNED (accepted: --allow-unsigned): nothing vouches for it"
        else:
            who = "!!! signature NOT checked (--allow-unsigned)"
        print(f"evidence {args.dir}: {verdict.files} file(s) match SHA256SUMS, nothing unlisted, {who}")
    return exitcodes.OK if verdict.ok else exitcodes.FAILED


def _show(args: argparse.Namespace) -> int:
    record = evidence.read(args.dir)
    print(json.dumps(record, indent=1, sort_keys=True) if args.json else evidence.render_text(record))
    if args.html:
        args.html.write_text(evidence.render_html(record, args.dir))
    return exitcodes.OK

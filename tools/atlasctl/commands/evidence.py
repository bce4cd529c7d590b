"""`atlasctl evidence verify|show DIR`: a rollout's evidence pack (docs/evidence.md).

verify: the signature of SHA256SUMS by the pinned key, every file it lists, no file it does not list, no
link (the pack directory a symbolic link, a file in it a symbolic or hard link), and the rollout its record is
bound to: the folder it sits in (<inventory>-<hash>/<rollout>.evidence) or --rollout, and the report beside it.
Exit status: 0 the pack is intact, bound to this rollout and signed by the pinned key (or unsigned, with
--allow-unsigned; an older, unbound pack with --allow-unbound); 1 anything changed, missing, extra, linked,
bound elsewhere, unsigned or signed by another key (one line each, naming the file); 2 bad input (no such
pack, no key to check it against, a record nested deeper than 64 levels).

show: the record as a table, JSON or an HTML page; informational (exit 0), with a WARNING line for a signer
that is not the pinned key (or no pinned key named), an unbound pack and a linked one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from atlasctl import evidence, exitcodes
from atlasctl.errors import UsageError
from atlasctl.outputs import safe
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
    verify.add_argument("--rollout", default="", metavar="ID",
                        help="the rollout the pack must be bound to (<start>-<release>, or "
                             "<inventory>-<hash>/<start>-<release>), instead of the folder it sits in")
    verify.add_argument("--allow-unbound", action="store_true",
                        help="accept an older pack that names no rollout (reported loudly)")
    verify.add_argument("--json", action="store_true", help="print the result as JSON")
    verify.set_defaults(func=_verify)

    show = esub.add_parser("show", help="print a pack as a table, as JSON, or as an HTML page")
    show.add_argument("dir", type=Path, help="the pack")
    show.add_argument("-i", "--inventory", default=None,
                      help="warn unless the pack names the key this inventory names (atlas_evidence_signing_key)")
    show.add_argument("--fingerprint", default="", metavar="FPR",
                      help="warn unless the pack names this key (full 40-hex fingerprint) as its signer")
    show.add_argument("--json", action="store_true", help="print the record (evidence.json) as JSON")
    show.add_argument("--html", type=Path, default=None, metavar="FILE",
                      help="also write a self-contained HTML page an auditor reads without the suite")
    show.set_defaults(func=_show)


def _verify(args: argparse.Namespace) -> int:
    if args.inventory and (args.keyring or args.fingerprint):
        raise UsageError("-i and --keyring/--fingerprint are two ways to name the key: pass one",
                         fix=evidence.KEY_FIX)
    binding = {"rollout": args.rollout, "allow_unbound": args.allow_unbound}
    if args.inventory:
        verdict = evidence.verify_with_inventory(args.dir, resolve_inventory(args.inventory), args.allow_unsigned,
                                                 **binding)
    else:
        verdict = evidence.verify(args.dir, keyring=args.keyring, fingerprint=args.fingerprint,
                                  allow_unsigned=args.allow_unsigned, **binding)
    if args.json:
        print(json.dumps(verdict.as_dict(), indent=2, sort_keys=True))
    for name, problem in verdict.problems:
        print(safe(f"{args.dir / name}: {problem}"), file=sys.stderr)
    if verdict.ok and not args.json:
        print(safe(f"evidence {args.dir}: {verdict.files} file(s) match SHA256SUMS, nothing unlisted, "
                   f"{_bound_text(verdict)}, {_signer_text(verdict)}"))
    return exitcodes.OK if verdict.ok else exitcodes.FAILED


def _signer_text(verdict: evidence.Verdict) -> str:
    if verdict.signed_by:
        return f"signed by {verdict.signed_by} (the pinned key)"
    if verdict.unsigned:
        return "!!! UNSIGNED (accepted: --allow-unsigned): nothing vouches for it"
    return "!!! signature NOT checked (--allow-unsigned)"


def _bound_text(verdict: evidence.Verdict) -> str:
    if verdict.unbound:
        return "!!! UNBOUND, older format (accepted: --allow-unbound): nothing ties it to this rollout"
    return f"bound to rollout {verdict.rollout}" if verdict.rollout else "binding NOT checked"


def _pinned(args: argparse.Namespace) -> str:
    """The fingerprint ``show`` holds the pack's signer to: --fingerprint, the inventory's key, or none."""
    if args.inventory and args.fingerprint:
        raise UsageError("-i and --fingerprint are two ways to name the key: pass one", fix=evidence.KEY_FIX)
    if args.inventory:
        return evidence.key_from_inventory(resolve_inventory(args.inventory))[0].replace(" ", "").upper()
    if not args.fingerprint:
        return ""
    try:
        return evidence.sig.normalize_fingerprints([args.fingerprint], "--fingerprint")[0]
    except evidence.sig.SignatureError as exc:
        raise UsageError(str(exc), fix=evidence.KEY_FIX) from None


def _show(args: argparse.Namespace) -> int:
    pinned = _pinned(args)
    record = evidence.read(args.dir)
    warnings = [f"WARNING: {w}" for w in evidence.show_warnings(args.dir, record, pinned)]
    if args.json:
        print(json.dumps(record, indent=1, sort_keys=True))
        for line in warnings:
            print(safe(line), file=sys.stderr)
    else:
        print("\n".join([*map(safe, warnings), evidence.render_text(record), *map(safe, warnings)]))
    if args.html:
        args.html.write_text(evidence.render_html(record, args.dir, warnings))
    return exitcodes.OK

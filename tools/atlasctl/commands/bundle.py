"""`atlasctl bundle build|sign|verify|push`: the air-gapped bundle, signed (docs/bundle-signing.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from atlasctl import bundle, bundle_push, bundle_trust, exitcodes
from atlasctl.errors import UsageError
from atlasctl.paths import cache_dir
from atlasctl.runner import resolve_inventory


def _trust_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keyring", type=Path, default=None,
                        help="public keyring on this machine holding the signing key (default: the inventory's "
                             "atlas_bundle_keyring)")
    parser.add_argument("--fingerprint", action="append", default=None, metavar="FPR",
                        help="full 40-hex fingerprint of a trusted signing key, repeatable (default: the "
                             "inventory's atlas_bundle_trusted_fingerprints)")
    parser.add_argument("--allow-unsigned", action="store_true",
                        help="DANGEROUS: do not check manifest.json.asc (reported loudly)")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bundle", help="build, verify and push offline bundles")
    bsub = parser.add_subparsers(dest="bundle_command", metavar="ACTION", required=True)

    build = bsub.add_parser("build", help="build or refresh a bundle from a spec (incremental)")
    build.add_argument("--spec", type=Path, required=True, help="bundle spec (bundle.yml)")
    build.add_argument("--out", type=Path, required=True, help="bundle directory (built or refreshed in place)")
    build.add_argument("--sign-key", default="", help="GPG key that signs manifest.json (default: the spec's sign)")
    build.add_argument("--sign-home", type=Path, default=None, help="gpg homedir of --sign-key")
    build.add_argument("--json", action="store_true", help="print the summary as JSON")
    build.set_defaults(func=_build)

    sign = bsub.add_parser("sign", help="sign a bundle's manifest.json (on the signing station) after checking it")
    sign.add_argument("dir", type=Path, help="bundle directory")
    sign.add_argument("--key", required=True, help="signing key (its fingerprint)")
    sign.add_argument("--homedir", type=Path, default=None, help="gpg homedir holding the secret key")
    sign.set_defaults(func=_sign)

    verify = bsub.add_parser("verify", help="check the signature, then every file of a bundle against its manifest")
    verify.add_argument("dir", type=Path, help="bundle directory")
    verify.add_argument("-i", "--inventory", default=None,
                        help="read atlas_bundle_keyring / atlas_bundle_trusted_fingerprints from this inventory")
    _trust_options(verify)
    verify.add_argument("--json", action="store_true", help="print the result as JSON")
    verify.set_defaults(func=_verify)

    push = bsub.add_parser("push", help="copy a bundle to nodes (resumable, delta) and verify it there; from "
                                        f"{bundle_push.FANOUT_MIN_NODES} nodes on along a fan-out tree")
    push.add_argument("-i", "--inventory", required=True, help="inventory (hosts of group atlas_nodes)")
    push.add_argument("--src", type=Path, required=True, help="bundle directory")
    push.add_argument("--dest", default=bundle_push.DEFAULT_DEST, help="path on the nodes (default: %(default)s)")
    push.add_argument("--limit", default=None, help="Ansible host pattern narrowing atlas_nodes")
    push.add_argument("--no-verify", action="store_true",
                      help="skip the nodes' verification after a direct push (a fan-out verifies every file at every "
                           "hop whatever this says)")
    push.add_argument("--allow-downgrade", action="store_true",
                      help="push a bundle built before the one a node accepted last (going back on purpose)")
    push.add_argument("--fan-out", action=argparse.BooleanOptionalAction, default=None,
                      help="send the bundle to the plan's roots only and have every other node pull it from a peer "
                           "that verified it (docs/fleet-scale.md); default: from "
                           f"{bundle_push.FANOUT_MIN_NODES} nodes on")
    push.add_argument("--per-source", type=int, default=2, metavar="N",
                      help="fan-out: pulls a node serves at once (default: %(default)s)")
    push.add_argument("--roots", type=int, default=1, metavar="N",
                      help="fan-out: nodes the controller sends to (default: %(default)s)")
    _trust_options(push)
    push.add_argument("--json", action="store_true", help="print the result as JSON")
    push.set_defaults(func=_push)


def _progress(text: str) -> None:
    if sys.stderr.isatty():
        print(f"bundle: {text}", file=sys.stderr)


def _build(args: argparse.Namespace) -> int:
    spec = bundle.BundleSpec.load(args.spec)
    out = args.out
    manifest = bundle.build_bundle(spec, out, cache_dir(), progress=_progress, sign_key=args.sign_key,
                                   sign_home=args.sign_home)
    summary = [{"kind": k, "files": n, "bytes": b} for k, n, b in bundle.iter_summary(manifest)]
    if args.json:
        print(json.dumps({"bundle": str(out), "name": manifest["name"], "kinds": summary}, indent=2))
    else:
        signed = (out / bundle.SIGNATURE).is_file()
        print(f"bundle {manifest['name']} at {out} ({'signed' if signed else 'UNSIGNED: sign it before use'})")
        for row in summary:
            print(f"  {row['kind']:<6} {row['files']:>5} files {row['bytes'] / 2**20:>10.1f} MiB")
    return exitcodes.OK


def _trust(args: argparse.Namespace, inventory: Path | None) -> bundle_trust.Trust:
    """--keyring/--fingerprint/--allow-unsigned, the rest from the inventory's variables."""
    if inventory and not (args.keyring and args.fingerprint):
        base = bundle_trust.from_inventory(inventory)
    else:
        base = bundle_trust.Trust("", (), False)
    return bundle_trust.Trust(str(args.keyring or base.keyring), tuple(args.fingerprint or base.fingerprints),
                              args.allow_unsigned or base.allow_unsigned)


def _check_signature(manifest: bundle.Manifest, trust: bundle_trust.Trust) -> tuple[dict, str]:
    """(JSON-able result, refusal message or '') of the signature over the manifest's one read; an opt-out
    is printed loudly to stderr."""
    from ansible_collections.atlas.serving.plugins.module_utils import signature as sig

    try:
        verdict = bundle.verify_signature(manifest, keyring=trust.keyring, fingerprints=trust.fingerprints,
                                          allow_unsigned=trust.allow_unsigned)
    except sig.SignatureError as exc:
        return {"ok": False, "reason": exc.reason, "message": str(exc)}, f"REFUSED ({exc.reason}): {exc}"
    for warning in verdict.warnings:
        print(f"!!! WARNING: bundle {manifest.root}: {warning}", file=sys.stderr)
    return {"ok": True} | verdict.as_dict(), ""


def _verify(args: argparse.Namespace) -> int:
    root = args.dir
    manifest = bundle.load(root)  # read once: not a bundle is a usage error naming the path
    inventory = resolve_inventory(args.inventory) if args.inventory else None
    signature, refused = _check_signature(manifest, _trust(args, inventory))
    bad = [] if refused else bundle.verify_bundle(root, manifest=manifest)
    if args.json:
        print(json.dumps({"bundle": str(root), "ok": not bad and not refused, "signature": signature,
                          "problems": [b.__dict__ for b in bad]}, indent=2))
    if refused:
        if not args.json:
            print(f"bundle {root}: {refused}\n  do not install from it", file=sys.stderr)
        return exitcodes.FAILED
    if args.json:
        return exitcodes.FAILED if bad else exitcodes.OK
    if bad:
        _print_problems(root, bad, "do not install from it")
    else:
        who = f"signed by {signature['primary_fingerprint']}" if signature.get("signed") else "NOT signature-checked"
        print(f"bundle {root}: {len(manifest.expected)} files match manifest.json (sha256 + md5), {who}")
    return exitcodes.FAILED if bad else exitcodes.OK


def _print_problems(root: Path, bad: list[bundle.BadFile], consequence: str) -> None:
    print(f"bundle {root}: {len(bad)} problem(s); {consequence}", file=sys.stderr)
    for b in bad:
        print(f"  {b.describe()}", file=sys.stderr)


def _sign(args: argparse.Namespace) -> int:
    root = args.dir
    manifest = bundle.load(root)  # read once: the bytes checked are the bytes signed
    bad = bundle.verify_bundle(root, manifest=manifest)
    if bad:
        _print_problems(root, bad, "not signing it")
        return exitcodes.FAILED
    from atlasctl.bundle_sources import sign_manifest

    sig = sign_manifest(root, args.key, args.homedir, data=manifest.raw)
    print(f"bundle {root}: manifest.json (sha256 {manifest.sha256}) signed by {args.key}: {sig}")
    return exitcodes.OK


def _push(args: argparse.Namespace) -> int:
    src = args.src
    dest = bundle_push.check_dest(args.dest)  # never / or a system directory: a push deletes what is not the bundle's
    for name, value in (("--per-source", args.per_source), ("--roots", args.roots)):
        if value < 1:
            raise UsageError(f"{name} {value}: a fan-out needs at least 1", fix=f"e.g. {name} 2")
    manifest = bundle.load(src)  # read once: the bytes whose signature is checked are the bytes sent
    inventory = resolve_inventory(args.inventory)
    signature, refused = _check_signature(manifest, _trust(args, inventory))
    if refused:
        print(f"bundle {src}: {refused}\n  not pushing it", file=sys.stderr)
        return exitcodes.FAILED
    bad = bundle.verify_bundle(src, manifest=manifest)
    if bad:
        _print_problems(src, bad, "not pushing it")
        return exitcodes.FAILED
    targets, groups = bundle_push.inventory_fleet(inventory, args.limit)
    fan_out = bundle_push.use_fanout(args.fan_out, len(targets))
    signed = bool(signature.get("signed"))
    plan, fallback = None, []
    if fan_out:  # each node verified every file it received: the play's verdict; a direct push's get checked here
        report = bundle_push.push_fanout(manifest, targets, groups, inventory, dest, judge_release=signed,
                                         allow_downgrade=args.allow_downgrade, per_source=args.per_source,
                                         roots=args.roots)
        results, plan, fallback, verified = report.results, report.plan, report.fallback, report.verified
        check = [t for t in targets if t.name in fallback]
    else:
        results = bundle_push.push(manifest, targets, dest, judge_release=signed, allow_downgrade=args.allow_downgrade)
        verified, check = None, targets
    if check and not args.no_verify and all(r.ok for r in results):
        proc = bundle_push.verify_on_nodes(inventory, dest, args.limit, manifest.sha256, check)
        verified = verified is not False and proc.returncode == 0
        if proc.returncode != 0:
            print(proc.stdout[-4000:] + proc.stderr[-2000:], file=sys.stderr)
    ok = all(r.ok for r in results) and verified is not False
    size = bundle_push.bundle_bytes(manifest)
    sent = sum(r.bytes_sent for r in results)
    if args.json:
        document = {"bundle": str(src), "dest": dest, "ok": ok, "verified": verified,
                    "mode": "fan-out" if fan_out else "direct", "bundle_bytes": size, "controller_bytes": sent,
                    "controller_ratio": round(sent / size, 3) if size else 0.0,
                    "hosts": [r.__dict__ for r in results]}
        if plan is not None:
            document |= {"rounds": plan.get("rounds", 0), "roots": plan.get("roots", []), "fallback": fallback,
                         "transfers": plan.get("transfers", [])}
        print(json.dumps(document, indent=2))
    else:
        for r in results:
            via = f" via {r.via}" if fan_out and r.via else ""
            print(f"{r.host:<20} {'ok' if r.ok else 'FAILED'} {r.files_sent} file(s) sent{via} {r.message}".rstrip())
            for peer, files in r.refused.items():
                print(f"{'':<20} refused {peer}'s copy (failed verification, not kept): {', '.join(files[:5])}")
        if plan is not None:
            print(f"fan-out: {plan.get('rounds', 0)} round(s) from {', '.join(plan.get('roots', [])) or 'no root'}; "
                  f"the controller sent {sent / 2**20:.1f} MiB for a bundle of {size / 2**20:.1f} MiB"
                  + (f"; pushed directly to {', '.join(fallback)}" if fallback else ""))
        if verified is not None:
            print(f"verified against {dest}/manifest.json on the nodes: {'ok' if verified else 'FAILED'}")
    return exitcodes.OK if ok else exitcodes.FAILED

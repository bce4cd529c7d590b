"""`atlasctl bundle build|verify|push`: the air-gapped bundle."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from atlasctl import bundle, bundle_push, exitcodes
from atlasctl.paths import cache_dir, lab_dir
from atlasctl.runner import resolve_inventory


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bundle", help="build, verify and push offline bundles")
    bsub = parser.add_subparsers(dest="bundle_command", metavar="ACTION", required=True)

    build = bsub.add_parser("build", help="build or refresh a bundle from a spec (incremental)")
    build.add_argument("--spec", type=Path, default=Path("inventory/lab/bundle.yml"),
                       help="bundle spec (default: %(default)s)")
    build.add_argument("--out", type=Path, default=None,
                       help="bundle directory (default: the lab's, $ATLAS_LAB_DIR/bundle)")
    build.add_argument("--json", action="store_true", help="print the summary as JSON")
    build.set_defaults(func=_build)

    verify = bsub.add_parser("verify", help="check every file of a bundle against its manifest")
    verify.add_argument("dir", type=Path, nargs="?", default=None, help="bundle directory (default: the lab's)")
    verify.add_argument("--json", action="store_true", help="print the result as JSON")
    verify.add_argument("--keyring", type=Path, default=None,
                        help="GPG keyring whose key must have signed manifest.json (manifest.json.asc)")
    verify.set_defaults(func=_verify)

    push = bsub.add_parser("push", help="copy a bundle to nodes (resumable, delta) and verify it there")
    push.add_argument("-i", "--inventory", required=True, help="inventory (hosts of group atlas_nodes)")
    push.add_argument("--src", type=Path, default=None, help="bundle directory (default: the lab's)")
    push.add_argument("--dest", default=bundle_push.DEFAULT_DEST, help="path on the nodes (default: %(default)s)")
    push.add_argument("--limit", default=None, help="Ansible host pattern narrowing atlas_nodes")
    push.add_argument("--no-verify", action="store_true", help="skip the verification on the nodes")
    push.add_argument("--json", action="store_true", help="print the result as JSON")
    push.set_defaults(func=_push)


def _progress(text: str) -> None:
    if sys.stderr.isatty():
        print(f"bundle: {text}", file=sys.stderr)


def _build(args: argparse.Namespace) -> int:
    spec = bundle.BundleSpec.load(args.spec)
    out = args.out or lab_dir() / "bundle"
    manifest = bundle.build_bundle(spec, out, cache_dir(), progress=_progress)
    summary = [{"kind": k, "files": n, "bytes": b} for k, n, b in bundle.iter_summary(manifest)]
    if args.json:
        print(json.dumps({"bundle": str(out), "name": manifest["name"], "kinds": summary}, indent=2))
    else:
        print(f"bundle {manifest['name']} at {out}")
        for row in summary:
            print(f"  {row['kind']:<6} {row['files']:>5} files {row['bytes'] / 2**20:>10.1f} MiB")
    return exitcodes.OK


def _verify(args: argparse.Namespace) -> int:
    root = args.dir or lab_dir() / "bundle"
    if args.keyring:
        from atlasctl.bundle_sources import verify_signature

        problem = verify_signature(root, args.keyring)
        if problem:
            print(f"bundle {root}: {problem}; do not install from it", file=sys.stderr)
            return exitcodes.FAILED
    bad = bundle.verify_bundle(root)
    if args.json:
        print(json.dumps({"bundle": str(root), "ok": not bad,
                          "problems": [b.__dict__ for b in bad]}, indent=2))
    elif bad:
        print(f"bundle {root}: {len(bad)} problem(s); do not install from it", file=sys.stderr)
        for b in bad:
            print(f"  {b.describe()}", file=sys.stderr)
    else:
        count = len(bundle.read_manifest(root)["files"])
        print(f"bundle {root}: {count} files match manifest.json (sha256 + md5)")
    return exitcodes.FAILED if bad else exitcodes.OK




def _push(args: argparse.Namespace) -> int:
    src = args.src or lab_dir() / "bundle"
    inventory = resolve_inventory(args.inventory)
    bad = bundle.verify_bundle(src)
    if bad:
        print(f"bundle {src}: {len(bad)} problem(s); not pushing it", file=sys.stderr)
        for b in bad:
            print(f"  {b.describe()}", file=sys.stderr)
        return exitcodes.FAILED
    targets = bundle_push.inventory_targets(inventory, args.limit)
    results = bundle_push.push(src, targets, args.dest)
    verified = None
    if not args.no_verify and all(r.ok for r in results):
        proc = bundle_push.verify_on_nodes(inventory, args.dest, args.limit)
        verified = proc.returncode == 0
        if not verified:
            print(proc.stdout[-4000:] + proc.stderr[-2000:], file=sys.stderr)
    ok = all(r.ok for r in results) and verified is not False
    if args.json:
        print(json.dumps({"bundle": str(src), "dest": args.dest, "ok": ok, "verified": verified,
                          "hosts": [r.__dict__ for r in results]}, indent=2))
    else:
        for r in results:
            print(f"{r.host:<20} {'ok' if r.ok else 'FAILED'} {r.files_sent} file(s) sent {r.message}".rstrip())
        if verified is not None:
            print(f"verified against {args.dest}/manifest.json on the nodes: {'ok' if verified else 'FAILED'}")
    return exitcodes.OK if ok else exitcodes.FAILED

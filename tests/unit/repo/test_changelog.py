"""The collection's changelog (antsibull-changelog): its fragments and changelogs/changelog.yaml lint clean,
its newest release is galaxy.yml's version, and CHANGELOG.md is what changelog.yaml generates.

One fragment per user-visible change goes under changelogs/fragments/; `antsibull-changelog release` in the
collection directory turns them into a release of galaxy.yml's version (DESIGN.md, "The collection").
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[3]
COLLECTION = ROOT / "collections" / "ansible_collections" / "atlas" / "serving"
TOOL = Path(sys.executable).parent / "antsibull-changelog"


def changelog(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``antsibull-changelog <args>`` in ``cwd`` (the collection directory)."""
    return subprocess.run([str(TOOL), *args], cwd=cwd or COLLECTION, capture_output=True, text=True, timeout=120)


def galaxy_version() -> str:
    return str(yaml.safe_load((COLLECTION / "galaxy.yml").read_text())["version"])


def test_fragments_and_changelog_yaml_lint_clean():
    for args in (("lint",), ("lint-changelog-yaml", "changelogs/changelog.yaml")):
        proc = changelog(*args)
        assert proc.returncode == 0 and proc.stdout.strip() == "", (args, proc.stdout, proc.stderr)


def test_the_newest_release_is_galaxy_version():
    releases = yaml.safe_load((COLLECTION / "changelogs" / "changelog.yaml").read_text())["releases"]
    version = galaxy_version()
    assert max(releases, key=Version) == version, (
        f"galaxy.yml says {version}: run `antsibull-changelog release` in {COLLECTION}")
    headings = re.findall(r"^## v(.+)$", (COLLECTION / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert headings and headings[0].replace("\\", "") == version, headings[:3]


def test_changelog_md_is_generated_from_changelog_yaml(tmp_path):
    for name in ("galaxy.yml", "CHANGELOG.md"):
        shutil.copy2(COLLECTION / name, tmp_path / name)
    shutil.copytree(COLLECTION / "changelogs", tmp_path / "changelogs")
    proc = changelog("generate", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "CHANGELOG.md").read_text() == (COLLECTION / "CHANGELOG.md").read_text(), (
        "CHANGELOG.md is not what changelogs/changelog.yaml generates: run `antsibull-changelog generate` in "
        f"{COLLECTION}, never edit CHANGELOG.md by hand")

"""Who besides root can change a bundle (module_utils/root_only.py), judged on real files: a group- or
world-writable directory or file, one owned by another account, a directory above the bundle, a link or a
FIFO inside it are refused, named with owner and mode and the fix; /tmp's sticky bit is accepted; the module
refuses through Ansible; and what `atlasctl bundle push`'s rsync writes passes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import root_only

from atlasctl import bundle_push
from atlasctl import inventory as shared
from atlasctl.bundle import load, write_manifest
from atlasctl.errors import UsageError
from atlasctl.paths import suite_root

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="judging owners needs files owned by root and by others")


def _bundle(tmp_path: Path) -> Path:
    root = tmp_path / "srv" / "atlas-bundle"
    (root / "cann").mkdir(parents=True)
    (root / "manifest.json").write_text("{}\n")
    (root / "cann" / "toolkit.run").write_text("#!/bin/sh\n")
    for path in (tmp_path / "srv", root, root / "cann"):
        path.chmod(0o755)
    return root


def _problems(root: Path) -> dict[str, str]:
    return {p.path: p.what for p in root_only.tree_problems(str(root))}


def test_a_root_only_bundle_under_tmp_passes(tmp_path: Path) -> None:
    """/tmp is world-writable with the sticky bit: only an entry's owner may rename it there."""
    root = _bundle(tmp_path)
    assert Path("/tmp").stat().st_mode & 0o1000
    assert _problems(root) == {}


@pytest.mark.parametrize(("rel", "mode", "said"), [
    ("", 0o775, "mode 0775: writable by its group"),
    ("cann", 0o757, "mode 0757: writable by others"),
    ("cann/toolkit.run", 0o664, "mode 0664: writable by its group"),
])
def test_a_writable_directory_or_installer_is_named_with_its_mode(tmp_path: Path, rel: str, mode: int,
                                                                  said: str) -> None:
    root = _bundle(tmp_path)
    target = root / rel if rel else root
    target.chmod(mode)
    problems = root_only.tree_problems(str(root))
    assert [(p.path, p.inside) for p in problems] == [(str(target), True)]
    assert said in problems[0].what and "owner root (0), group root (0)" in problems[0].what
    message = root_only.describe(problems, str(root), "bundle")
    assert message.startswith(f"bundle {root}: a user other than root can change")
    assert f"fix: chown -R root:root {root} && chmod -R go-w {root}" in message


def test_a_file_owned_by_another_account_is_named(tmp_path: Path) -> None:
    root = _bundle(tmp_path)
    os.chown(root / "cann/toolkit.run", NOBODY, NOBODY)
    [problem] = root_only.tree_problems(str(root))
    assert problem.path == str(root / "cann/toolkit.run")
    assert f"owner nobody ({NOBODY})" in problem.what and problem.what.endswith("not owned by root")


def test_a_directory_above_the_bundle_is_fixed_on_its_own(tmp_path: Path) -> None:
    root = _bundle(tmp_path)
    (tmp_path / "srv").chmod(0o775)
    problems = root_only.tree_problems(str(root))
    assert [(p.path, p.inside) for p in problems] == [(str(tmp_path / "srv"), False)]
    message = root_only.describe(problems, str(root))
    assert f"fix: chown root:root {tmp_path / 'srv'} && chmod go-w {tmp_path / 'srv'}" in message
    assert "chown -R" not in message


def test_a_sticky_directory_inside_the_bundle_is_not_accepted(tmp_path: Path) -> None:
    root = _bundle(tmp_path)
    (root / "cann").chmod(0o1777)
    assert "writable by others" in _problems(root)[str(root / "cann")]


def test_links_and_special_files_inside_are_refused_a_linked_bundle_is_judged_where_it_is(tmp_path: Path) -> None:
    root = _bundle(tmp_path)
    os.symlink("/etc/passwd", root / "cann" / "nnal.run")
    os.mkfifo(root / "fifo")
    problems = _problems(root)
    assert problems == {str(root / "cann/nnal.run"): root_only.LINK, str(root / "fifo"): root_only.SPECIAL}
    (root / "cann/nnal.run").unlink()
    (root / "fifo").unlink()
    link = tmp_path / "current"
    link.symlink_to(root)
    assert _problems(link) == {}
    (tmp_path / "srv").chmod(0o777)  # above the link's target, not above the link
    assert str(tmp_path / "srv") in _problems(link)


def test_many_problems_are_counted(tmp_path: Path) -> None:
    root = _bundle(tmp_path)
    for i in range(8):
        (root / f"f{i}").write_text("x")
        (root / f"f{i}").chmod(0o666)
    message = root_only.describe(root_only.tree_problems(str(root)), str(root))
    assert "; and 3 more." in message


def _module(path: Path, *extra: str) -> tuple[int, dict]:
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(suite_root() / "collections"),
               ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible")), "localhost", "-o", "-m",
                           "atlas.serving.root_only", "-a", f"path={path} name=bundle", *extra],
                          env=env, capture_output=True, text=True, timeout=120)
    return proc.returncode, json.loads(proc.stdout.split("=>", 1)[1])


def test_the_module_refuses_and_passes(tmp_path: Path) -> None:
    root = _bundle(tmp_path)
    rc, result = _module(root, "--check")
    assert rc == 0 and result["changed"] is False and result["checked"] == str(root)
    root.chmod(0o775)
    rc, result = _module(root)
    assert rc != 0 and f"bundle {root}: a user other than root can change" in result["msg"]
    rc, result = _module(tmp_path / "absent")
    assert rc != 0 and "No such file or directory" in result["msg"]


@pytest.mark.skipif(not shutil.which("rsync"), reason="rsync")
def test_what_bundle_push_writes_passes_the_node_check(tmp_path: Path) -> None:
    """Push's receiver options, run locally as root: a controller-side bundle of another owner with group-writable
    files arrives root's alone."""
    src = _bundle(tmp_path / "controller")
    for path in (src, src / "cann", src / "cann/toolkit.run", src / "manifest.json"):
        os.chown(path, NOBODY, NOBODY)
        path.chmod(0o775 if path.is_dir() else 0o664)
    dest = _bundle(tmp_path / "node").parent / "pushed"
    root = shared.target("n1", {"ansible_host": "10.0.0.1", "ansible_user": "root"})
    options = [a for a in bundle_push.receiver_args(root, str(dest)) if a.startswith("--ch")]
    assert options == ["--chown=root:root", "--chmod=go-w"]
    subprocess.run(["rsync", "--archive", *options, f"{src}/", f"{dest}/"], check=True, capture_output=True, timeout=60)
    assert (dest / "cann/toolkit.run").read_text() == "#!/bin/sh\n"
    assert _problems(dest) == {}


def test_push_runs_rsync_as_root_or_refuses_before_any_transfer(tmp_path: Path) -> None:
    deploy = shared.target("n1", {"ansible_host": "10.0.0.1", "ansible_user": "atlas-deploy", "ansible_become": "yes"})
    argv = bundle_push.rsync_argv(Path("/b"), deploy, "/srv/atlas-bundle", part="files")
    assert argv[argv.index("--rsync-path") + 1] == "sudo -n mkdir -p /srv/atlas-bundle && sudo -n rsync"
    assert "--chown=root:root" in argv and "--chmod=go-w" in argv
    root = shared.target("n1", {"ansible_host": "10.0.0.1", "ansible_user": "root"})
    assert bundle_push.receiver_args(root, "/srv/b")[-1] == "mkdir -p /srv/b && rsync"
    plain = shared.target("n2", {"ansible_host": "10.0.0.2", "ansible_user": "atlas-deploy"})
    src = _bundle(tmp_path)
    write_manifest(src, "t")
    with pytest.raises(UsageError, match="n2: bundle push connects as atlas-deploy without ansible_become"):
        bundle_push.as_root(plain)
    with pytest.raises(UsageError, match="n2: bundle push connects as atlas-deploy without ansible_become"):
        bundle_push.push(load(src), [deploy, plain])  # before the first transfer: deploy's address does not exist

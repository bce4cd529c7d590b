"""Real-format CANN install trees for tests, laid out from the committed vendor records.

``tests/fixtures/vendor/cann/<line>/`` holds the record files of one CANN line at their paths under an install
root (``SOURCES.md`` there names the source of each). :func:`lay_out` copies them under a directory and adds
what the installers make besides the records, as the sources describe it:

* before 8.5 ``ascend-toolkit/latest`` is a real directory kept by CANN's latest_manager: links into the last
  installed version (``opp_kernel -> ../<v>/opp_kernel``), a real ``<arch>-linux`` directory, ``version.cfg``
  (the fixture's). What ``latest/<arch>-linux`` holds is unsourced: here a link to the toolkit record, the file
  the installation guides read through it.
* from 8.5 ``cann -> cann-<v>`` and ``ascend-toolkit/latest -> <root>/cann`` (seen on one real 9.0.0 node)
* ``nnal/atb/latest -> <v>`` (ATB's installer: ``ln -snf``)
* ``set_env.sh``: ``ascend-toolkit/set_env.sh`` (every line), ``cann-<v>/set_env.sh`` (reached as
  ``cann/set_env.sh``, 8.5+), ``nnal/atb/set_env.sh`` (moved up out of the version directory by ATB's installer)
* the uninstallers at their documented paths (stubs): toolkit ``<vdir>/<arch>-linux/script/uninstall.sh``,
  kernels ``opp_kernel/script/uninstall.sh``, ops ``<arch>-linux/script/ops_uninstall.sh``, ATB's
  ``nnal/atb/<v>/scripts/uninstall.sh``, from 8.5 ``nnal/nnal_uninstall.sh``
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vendor" / "cann"
ARCH = "aarch64"  # the arch of the committed records
LINES = ("7.0.RC1", "8.0.0", "8.3.RC1", "8.5.0", "9.0.0", "9.1.0")
STUB = "#!/bin/bash\n# test stub of a Huawei uninstaller\nexit 0\n"


def uses_cann_layout(line: str) -> bool:
    """8.5 and later: ``cann-<v>``; before: ``ascend-toolkit/<v>``."""
    return line in ("8.5.0", "9.0.0", "9.1.0")


def fixture_files(line: str) -> dict[str, Path]:
    """``{path relative to the install root: fixture file}`` of one CANN line."""
    base = FIXTURES / line
    if not base.is_dir():
        raise ValueError(f"no vendor fixture for CANN {line}; the lines are {', '.join(LINES)}")
    return {path.relative_to(base).as_posix(): path for path in sorted(base.rglob("*")) if path.is_file()}


def toolkit_dir(root: Path, line: str) -> Path:
    return root / f"cann-{line}" if uses_cann_layout(line) else root / "ascend-toolkit" / line


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    os.symlink(target, path)


def _set_env(home: str) -> str:
    return f"export ASCEND_TOOLKIT_HOME={home}\nexport ASCEND_HOME_PATH=${{ASCEND_TOOLKIT_HOME}}\n"


def _latest_dir(root: Path, line: str) -> None:
    """Before 8.5: ``ascend-toolkit/latest`` as a real directory of links into ``line`` (plus version.cfg)."""
    latest = root / "ascend-toolkit" / "latest"
    if latest.is_dir():
        shutil.rmtree(latest)
    latest.mkdir(parents=True)
    _link(latest / "opp_kernel", f"../{line}/opp_kernel")
    _link(latest / f"{ARCH}-linux" / "ascend_toolkit_install.info",
          f"../../{line}/{ARCH}-linux/ascend_toolkit_install.info")
    shutil.copyfile(FIXTURES / line / "ascend-toolkit" / "latest" / "version.cfg", latest / "version.cfg")
    _write(root / "ascend-toolkit" / "set_env.sh", _set_env(str(latest)), 0o755)


def _cann_links(root: Path, line: str) -> None:
    """From 8.5: ``cann -> cann-<v>``, ``ascend-toolkit/latest -> <root>/cann``, the two set_env.sh."""
    _link(root / "cann", f"cann-{line}")
    _link(root / "ascend-toolkit" / "latest", str(root / "cann"))
    _write(root / f"cann-{line}" / "set_env.sh", _set_env(str(root / f"cann-{line}")), 0o755)
    _write(root / "ascend-toolkit" / "set_env.sh", f". {root}/cann/set_env.sh\n", 0o755)


def _uninstallers(root: Path, line: str) -> None:
    vdir = toolkit_dir(root, line)
    scripts = [vdir / f"{ARCH}-linux" / "script" / "uninstall.sh"]
    if uses_cann_layout(line):
        scripts.append(vdir / f"{ARCH}-linux" / "script" / "ops_uninstall.sh")
    else:
        scripts.append(vdir / "opp_kernel" / "script" / "uninstall.sh")
    if (root / "nnal" / "atb" / line).is_dir():
        scripts.append(root / "nnal" / "atb" / line / "scripts" / "uninstall.sh")
        if uses_cann_layout(line):
            scripts.append(root / "nnal" / "nnal_uninstall.sh")
    for script in scripts:
        _write(script, STUB, 0o755)


def lay_out(root: Path, *lines: str) -> Path:
    """Install CANN ``lines`` side by side under ``root`` as the real installers leave them, the last one the
    links name; return ``root``. The two toolkit layouts never live together (moving to 8.5 removes the earlier
    versions), so ``lines`` are all before 8.5 or all 8.5 and later."""
    if not lines:
        raise ValueError("name at least one CANN line")
    if len({uses_cann_layout(line) for line in lines}) > 1:
        raise ValueError(f"CANN {', '.join(lines)}: the layouts before and from 8.5 never live side by side")
    root.mkdir(parents=True, exist_ok=True)
    for line in lines:
        for rel, source in fixture_files(line).items():
            if rel.startswith("ascend-toolkit/latest/"):
                continue
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, root / rel)
        if uses_cann_layout(line):
            _cann_links(root, line)
        else:
            _latest_dir(root, line)
        if (root / "nnal" / "atb" / line).is_dir():
            _link(root / "nnal" / "atb" / "latest", line)
            _write(root / "nnal" / "atb" / "set_env.sh",
                   f"export ATB_HOME_PATH={root}/nnal/atb/latest/atb/cxx_abi_1\n", 0o755)
        _uninstallers(root, line)
    return root

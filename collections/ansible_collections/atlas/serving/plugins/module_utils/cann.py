# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What of the Ascend stack (CANN toolkit, kernels/ops, NNAL, driver, firmware) a node has.

Read from the version records Huawei's installers write:

* toolkit before 8.5: ``<path>/ascend-toolkit/latest/<arch>-linux/ascend_toolkit_install.info``
* toolkit 8.5 and later: ``<path>/cann/<arch>-linux/ascend_toolkit_install.info``
  (``key=value`` lines: package_name, version, innerversion, arch, os, path)
* kernels (< 8.5) and ops (8.5+): ``<toolkit version dir>/opp_kernel/version.info``
* NNAL: ``<path>/nnal/atb/latest/version.info``
* driver and firmware: ``<path>/driver/version.info``, ``<path>/firmware/version.info`` (``Version=``)

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import os
import platform
import re

DEFAULT_INSTALL_PATH = "/usr/local/Ascend"
TOOLKIT_INFO = "ascend_toolkit_install.info"
_VERSION = re.compile(r"^(?P<major>\d+)\.(?P<minor>\d+)\.(?:RC(?P<rc>\d+)|(?P<patch>\d+))(?P<tail>(?:\.\d+)*)")


def parse_key_values(text):
    """``key=value`` lines -> dict with lower-case keys; blank lines and ``#`` comments skipped."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        values.setdefault(key.strip().lower(), value.strip())
    return values


def version_key(version):
    """Sort key of a CANN version: 7.0.RC1 < 7.0.0 < 7.0.1.1 < 8.0.RC3 < 8.0.0 < 8.5.0.

    Pre-release tails (``.alpha002``, ``-beta.1``) are ignored. ``None`` when unparsable.
    """
    match = _VERSION.match(version or "")
    if not match:
        return None
    final, number = (0, int(match.group("rc"))) if match.group("rc") is not None else (1, int(match.group("patch")))
    tail = tuple(int(part) for part in match.group("tail").split(".") if part)
    return (int(match.group("major")), int(match.group("minor")), final, number) + tail


def plan_action(installed, wanted):
    """What the installer must do to go from ``installed`` to ``wanted``.

    ``none`` (already there), ``install`` (nothing installed), ``upgrade`` (newer) or
    ``downgrade`` (older: ``--upgrade`` refuses it, so uninstall then install).
    """
    if installed == wanted:
        return "none"
    if not installed:
        return "install"
    old, new = version_key(installed), version_key(wanted)
    if old is None or new is None:
        raise ValueError(
            f"cannot order CANN versions {installed!r} and {wanted!r}; expected forms like 8.3.RC1 or 8.5.0"
        )
    return "upgrade" if new > old else "downgrade"


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def _record(path):
    text = _read(path)
    return None if text is None else parse_key_values(text)


def _arch_dirs(root, host_arch):
    """``<arch>-linux`` directories under ``root``, the host's first."""
    try:
        names = sorted(name for name in os.listdir(root) if name.endswith("-linux"))
    except OSError:
        return []
    preferred = host_arch + "-linux"
    return sorted(names, key=lambda name: name != preferred)


def _toolkit(install_path, host_arch):
    """The installed toolkit, newest layout first (a 8.5 install keeps an ascend-toolkit/latest link)."""
    for layout, home in (("cann", "cann"), ("ascend-toolkit", "ascend-toolkit/latest")):
        root = os.path.join(install_path, home)
        for arch_dir in _arch_dirs(root, host_arch):
            info_file = os.path.join(root, arch_dir, TOOLKIT_INFO)
            record = _record(info_file)
            if record is None:
                continue
            return {
                "installed": True,
                "layout": layout,
                "version": record.get("version"),
                "innerversion": record.get("innerversion"),
                "arch": record.get("arch") or arch_dir[: -len("-linux")],
                "package_name": record.get("package_name"),
                "home": root,
                "version_dir": os.path.realpath(root),
                "info_file": info_file,
                "uninstall_script": os.path.join(root, arch_dir, "script", "uninstall.sh"),
            }
    return {"installed": False, "layout": None, "version": None}


def _versioned(record_file, uninstall_dir, extra_keys=()):
    record = _record(record_file)
    if record is None or not record.get("version"):
        return {"installed": False, "version": None}
    facts = {
        "installed": True,
        "version": record.get("version"),
        "package_name": record.get("package_name"),
        "info_file": record_file,
        "uninstall_script": os.path.join(uninstall_dir, "script", "uninstall.sh"),
    }
    for key in extra_keys:
        facts[key] = record.get(key)
    return facts


def _kernels(toolkit):
    if not toolkit["installed"]:
        return {"installed": False, "version": None}
    directory = os.path.join(toolkit["home"], "opp_kernel")
    return _versioned(os.path.join(directory, "version.info"), directory, ("soc_version",))


def _nnal(install_path):
    directory = os.path.join(install_path, "nnal", "atb", "latest")
    facts = _versioned(os.path.join(directory, "version.info"), directory)
    if facts["installed"]:
        facts["home"] = directory
    return facts


def _plain_version(path):
    record = _record(path)
    if record is None:
        return {"installed": False, "version": None, "info_file": path}
    return {"installed": True, "version": record.get("version"), "info_file": path}


def set_env_scripts(install_path, toolkit, nnal):
    """The ``set_env.sh`` scripts a serving process sources, in order; only those that exist."""
    candidates = []
    if toolkit.get("layout") == "cann":
        candidates.append(os.path.join(install_path, "cann", "set_env.sh"))
    candidates.append(os.path.join(install_path, "ascend-toolkit", "set_env.sh"))
    if nnal.get("installed"):
        candidates.append(os.path.join(install_path, "nnal", "atb", "set_env.sh"))
    return [path for path in candidates if os.path.isfile(path)]


def gather(install_path=DEFAULT_INSTALL_PATH, host_arch=None):
    """Everything known about the Ascend stack under ``install_path``: the ``cann`` fact."""
    install_path = os.path.normpath(install_path)
    host_arch = host_arch or platform.machine()
    toolkit = _toolkit(install_path, host_arch)
    nnal = _nnal(install_path)
    scripts = set_env_scripts(install_path, toolkit, nnal)
    return {
        "install_path": install_path,
        "host_arch": host_arch,
        "toolkit": toolkit,
        "kernels": _kernels(toolkit),
        "nnal": nnal,
        "driver": _plain_version(os.path.join(install_path, "driver", "version.info")),
        "firmware": _plain_version(os.path.join(install_path, "firmware", "version.info")),
        "set_env_scripts": scripts,
        "serving_set_env_scripts": [path for path in scripts if not _is_compat_script(path, toolkit, install_path)],
    }


def _is_compat_script(path, toolkit, install_path):
    """With the 8.5 layout, ascend-toolkit/set_env.sh only sources cann/set_env.sh again."""
    return toolkit.get("layout") == "cann" and path == os.path.join(install_path, "ascend-toolkit", "set_env.sh")

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

Every version installed side by side is read too (:func:`installed_versions`): CANN keeps versions next to
each other, each in its own directory (before 8.5 ``ascend-toolkit/<v>``, from 8.5 ``cann-<v>``, NNAL
``nnal/atb/<v>``), the links (``ascend-toolkit/latest``, ``cann``, ``nnal/atb/latest``) naming the last
installed. A release pins its version through that version's own environment scripts
(:func:`version_scripts`), never through the links. The two toolkit layouts never live side by side: moving
to 8.5 takes ``--upgrade`` (or uninstalling the earlier versions), going back from 8.5 ``--uninstall``, then
``--install`` (platform-upgrade-facts section 3; :func:`plan_versions`).

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import glob
import json
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


def layout_of(version):
    """``cann`` (8.5 and later: ``cann-<v>``) or ``ascend-toolkit`` (before: ``ascend-toolkit/<v>``)."""
    key = version_key(version)
    return "cann" if key is not None and key >= version_key("8.5.0") else "ascend-toolkit"


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


def version_scripts(install_path, version):
    """The environment scripts that pin ``version`` whatever the links name: the toolkit's own
    (``cann-<v>/set_env.sh`` from 8.5, ``ascend-toolkit/<v>/bin/setenv.bash`` before), then NNAL's
    (``nnal/atb/<v>/atb/set_env.sh``), in the order a serving process sources them."""
    if layout_of(version) == "cann":
        toolkit = os.path.join(install_path, f"cann-{version}", "set_env.sh")
    else:
        toolkit = os.path.join(install_path, "ascend-toolkit", version, "bin", "setenv.bash")
    return [toolkit, os.path.join(install_path, "nnal", "atb", version, "atb", "set_env.sh")]


def _real_dirs(pattern):
    return sorted(path for path in glob.glob(pattern) if os.path.isdir(path) and not os.path.islink(path))


def installed_versions(install_path, host_arch):
    """``{version: {layout, version_dir, toolkit, kernels, nnal, set_env_scripts, uninstall_scripts}}`` of every
    CANN version installed side by side (``toolkit``/``kernels``/``nnal``: the installed version of that part or
    None); ``set_env_scripts`` are the existing ones of :func:`version_scripts`."""
    found = {}
    tk_dirs = _real_dirs(os.path.join(install_path, "ascend-toolkit", "*")) + _real_dirs(
        os.path.join(install_path, "cann-*"))
    for vdir in tk_dirs:
        for arch_dir in _arch_dirs(vdir, host_arch):
            record = _record(os.path.join(vdir, arch_dir, TOOLKIT_INFO))
            if not record or not record.get("version"):
                continue
            version = record["version"]
            kernels = _record(os.path.join(vdir, "opp_kernel", "version.info")) or {}
            found[version] = {
                "layout": layout_of(version), "version_dir": vdir, "toolkit": version,
                "kernels": kernels.get("version"), "nnal": None,
                "uninstall_scripts": {"toolkit": os.path.join(vdir, arch_dir, "script", "uninstall.sh")},
            }
            break
    for ndir in _real_dirs(os.path.join(install_path, "nnal", "atb", "*")):
        record = _record(os.path.join(ndir, "version.info"))
        if not record or not record.get("version"):
            continue
        version = record["version"]
        entry = found.setdefault(version, {"layout": layout_of(version), "version_dir": None, "toolkit": None,
                                           "kernels": None, "nnal": None, "uninstall_scripts": {}})
        entry["nnal"] = version
        entry["uninstall_scripts"]["nnal"] = os.path.join(ndir, "script", "uninstall.sh")
    for version, entry in found.items():
        entry["set_env_scripts"] = [path for path in version_scripts(install_path, version) if os.path.isfile(path)]
    return found


def plan_versions(versions, wanted, components):
    """What installing CANN ``wanted`` (its ``components``: toolkit, kernels, nnal) does to a node holding
    ``versions`` (:func:`installed_versions`): ``{actions: {component: none|install|upgrade}, removes: [versions
    the move uninstalls], keeps_others: bool, why}``. Within one toolkit layout a version installs beside the
    others (``install``); into the 8.5 layout from an earlier one the toolkit takes ``--upgrade``, which removes
    every earlier toolkit; back from 8.5 every 8.5+ toolkit is uninstalled first (a ``--upgrade`` cannot go
    back). A removed version's kernels/ops go with its toolkit; NNAL versions stay side by side."""
    have = versions.get(wanted) or {}
    layout = layout_of(wanted)
    others = sorted((v for v, e in versions.items() if v != wanted and e.get("toolkit")),
                    key=lambda v: version_key(v) or ())
    crossing = [v for v in others if versions[v]["layout"] != layout]
    actions = {}
    for component in components:
        if have.get(component) == wanted:
            actions[component] = "none"
        elif component == "toolkit" and crossing and layout == "cann":
            actions[component] = "upgrade"
        else:
            actions[component] = "install"
    why = ""
    if crossing and actions.get("toolkit", "none") != "none":
        why = (f"CANN {', '.join(crossing)} ({'ascend-toolkit/<version>' if layout == 'cann' else 'cann-<version>'})"
               f" cannot stay beside {wanted} ({'cann-<version>' if layout == 'cann' else 'ascend-toolkit/<version>'}):"
               + (" moving to the 8.5 layout takes --upgrade, which removes the earlier versions" if layout == "cann"
                  else " going back from the 8.5 layout takes --uninstall of it, then --install")
               + " (CANN 8.5.0 installation guide and release notes)")
    return {"actions": actions, "removes": crossing if actions.get("toolkit", "none") != "none" else [],
            "keeps_others": not crossing, "why": why}


def release_pins(release_dir, service):
    """The CANN each kept release pins: ``{pinned: {release: version}, unknown: [releases whose record names
    none]}``, read from ``<release_dir>/<release>/<service>.json`` (its ``cann``); a container release runs its
    image's CANN and pins none of the host's."""
    pinned, unknown = {}, []
    for path in sorted(glob.glob(os.path.join(release_dir, "*", service + ".json"))):
        release = os.path.basename(os.path.dirname(path))
        try:
            with open(path, encoding="utf-8") as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            unknown.append(release)
            continue
        if record.get("runtime") == "container":
            continue
        if record.get("cann"):
            pinned[release] = str(record["cann"])
        else:
            unknown.append(release)
    return {"pinned": pinned, "unknown": unknown}


def prune_versions(versions, pins, keep, managed):
    """Which installed CANN versions no kept release pins: ``{remove: [versions], held: {version: [releases]},
    why_not: ''}``. Only versions the suite installed (``managed``) are candidates, never one installed by other
    hands; ``keep``: versions kept whatever pins them (the one being installed). Nothing is removed while a kept
    release's record names no CANN (``pins['unknown']``: a release deployed before releases pinned their CANN):
    that release may run any of them; ``why_not`` says so."""
    held = {}
    for release, version in sorted((pins or {}).get("pinned", {}).items()):
        held.setdefault(version, []).append(release)
    unknown = (pins or {}).get("unknown", [])
    if unknown:
        return {"remove": [], "held": held,
                "why_not": f"release(s) {', '.join(unknown)} name no CANN in their record: any installed version "
                           "may be theirs, so none is removed"}
    remove = sorted((v for v in versions if v in managed and v not in held and v not in keep),
                    key=lambda v: version_key(v) or ())
    return {"remove": remove, "held": held, "why_not": ""}


def read_managed(path):
    """The CANN versions the suite installed, as its record file lists them (``[]`` when there is none)."""
    text = _read(path) if path else None
    try:
        versions = json.loads(text) if text else []
    except ValueError:
        return []
    return sorted(str(v) for v in versions) if isinstance(versions, list) else []


def gather(install_path=DEFAULT_INSTALL_PATH, host_arch=None, release_dir=None, service=None, managed_file=None):
    """Everything known about the Ascend stack under ``install_path``: the ``cann`` fact (with ``pins``, the CANN
    each kept release pins, when ``release_dir`` and ``service`` are given; ``managed``, the versions the suite
    installed, when ``managed_file`` is)."""
    install_path = os.path.normpath(install_path)
    host_arch = host_arch or platform.machine()
    toolkit = _toolkit(install_path, host_arch)
    nnal = _nnal(install_path)
    scripts = set_env_scripts(install_path, toolkit, nnal)
    facts = {
        "install_path": install_path,
        "host_arch": host_arch,
        "toolkit": toolkit,
        "kernels": _kernels(toolkit),
        "nnal": nnal,
        "driver": _plain_version(os.path.join(install_path, "driver", "version.info")),
        "firmware": _plain_version(os.path.join(install_path, "firmware", "version.info")),
        "set_env_scripts": scripts,
        "serving_set_env_scripts": [path for path in scripts if not _is_compat_script(path, toolkit, install_path)],
        "versions": installed_versions(install_path, host_arch),
    }
    if release_dir and service:
        facts["pins"] = release_pins(release_dir, service)
    if managed_file:
        facts["managed"] = read_managed(managed_file)
    return facts


def _is_compat_script(path, toolkit, install_path):
    """With the 8.5 layout, ascend-toolkit/set_env.sh only sources cann/set_env.sh again."""
    return toolkit.get("layout") == "cann" and path == os.path.join(install_path, "ascend-toolkit", "set_env.sh")

# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What of the Ascend stack (CANN toolkit, kernels/ops, NNAL, driver, firmware) a node has.

Read from the version records Huawei's installers write (docs/ascend-platform.md lists each with its source):

* toolkit, every line: ``<version dir>/<arch>-linux/ascend_toolkit_install.info`` (``key=value``; ``version`` is
  the release), the current one read through ``cann/`` (8.5 and later) or ``ascend-toolkit/latest/`` (before)
* kernels, before 8.5: ``ascend-toolkit/<v>/opp_kernel/version.info`` (``version_dir=`` is the release,
  ``Version=`` the component build)
* ops, 8.5 and later: ``cann-<v>/<arch>-linux/ascend_ops_install.info``, else ``cann-<v>/share/info/<pkg>/version.info``
* NNAL: ``nnal/atb/<v>/version.info`` (indented ``Key : Value`` lines), else the directory name ``<v>``
* driver and firmware: ``driver/version.info`` (``package_version``, else ``Version``), ``firmware/version.info``
  (``Version`` is the firmware build, ``package_version`` the HDK release)

Every version installed side by side is read too (:func:`installed_versions`): CANN keeps versions next to
each other, each in its own directory (before 8.5 ``ascend-toolkit/<v>``, from 8.5 ``cann-<v>``, NNAL
``nnal/atb/<v>``). Before 8.5 ``ascend-toolkit/latest`` is a real directory of links (plus ``version.cfg``) that
names the last installed; from 8.5 ``cann`` and ``ascend-toolkit/latest`` are links; ``nnal/atb/latest`` is a
link. None of them is a version. A release pins its version through that version's own environment scripts
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
OPS_INFO = "ascend_ops_install.info"
# Directory names beside the version directories that are never a version: the links (and before 8.5 the real
# directory) naming the last installed, and ATB's backup of the version an --upgrade replaces.
_NOT_VERSIONS = ("latest",)
_BACKUP_SUFFIX = "_recover"
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


def parse_colon_values(text):
    """``Key : Value`` lines -> dict, keys as written (case kept, blanks around them dropped): the shape of
    NNAL's version.info, whose lines start with four spaces (``    Ascend-cann-atb : 9.1.0``). Lines without a
    colon are skipped."""
    values = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon and key.strip():
            values.setdefault(key.strip(), value.strip())
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


# --- one parser per vendor record -------------------------------------------------------------------------------

def read_toolkit_info(path):
    """The toolkit's ``<version dir>/<arch>-linux/ascend_toolkit_install.info``, every line (7.0.RC1 ... 9.1.0):
    lower-case ``key=value`` lines package_name, version (the release), innerversion, compatible_version, arch, os,
    path (CANN installation guides 8.0.0/8.5.0/9.x "checking the version", sample records 7.0.RC1 ... 9.1.0).
    ``path=`` is left unread: real 8.5.0 installs disagree on it. ``None`` when absent or without a version."""
    record = _record(path)
    if not record or not record.get("version"):
        return None
    return {"version": record["version"], "innerversion": record.get("innerversion"),
            "package_name": record.get("package_name"), "arch": record.get("arch"), "info_file": path}


def read_kernels_info(path):
    """The kernels package's ``ascend-toolkit/<v>/opp_kernel/version.info``, before 8.5 (7.0.x ... 8.3):
    ``Version=`` is the component build (8.0.0: 7.6.0.1.220), ``version_dir=`` the CANN release (CANN 8.0.0 and
    8.3.RC1 installation guides: read ``version_dir``; CANN's packaging scripts ``grep "^version_dir="``). 7.0.RC1
    files carry the same pair; where 7.0.RC1's kernels record lies is unconfirmed. The record names no package.
    ``None`` when absent or without ``version_dir``."""
    record = _record(path)
    if not record or not record.get("version_dir"):
        return None
    return {"version": record["version_dir"], "build": record.get("version"), "package_name": None,
            "info_file": path}


def read_ops_info(version_dir, arch_dir):
    """The ops package's record, 8.5 and later (it replaces the kernels): first
    ``cann-<v>/<arch>-linux/ascend_ops_install.info`` (``key=value``: package_name, version, arch, path; English
    8.5.0 and 9.0/9.1 installation guides), then ``cann-<v>/share/info/<pkg>/version.info`` (the Chinese 8.5.0
    guide; CANN's 8.5 packaging keeps one such directory per package). The names under ``share/info`` are
    unsourced: a ``<pkg>`` whose name holds ``ops`` is taken, its release read from ``version_dir`` when present
    (as CANN's version.info files carry it), else ``version``. ``None`` when neither holds a version."""
    info_file = os.path.join(version_dir, arch_dir, OPS_INFO)
    record = _record(info_file)
    if record and record.get("version"):
        return {"version": record["version"], "build": None, "package_name": record.get("package_name"),
                "info_file": info_file}
    for info_file in sorted(glob.glob(os.path.join(version_dir, "share", "info", "*ops*", "version.info"))):
        record = _record(info_file) or {}
        release = record.get("version_dir") or record.get("version")
        if release:
            return {"version": release, "build": record.get("version"), "package_name": record.get("package_name"),
                    "info_file": info_file}
    return None


def read_nnal_info(version_dir):
    """NNAL's (ATB) ``nnal/atb/<v>/version.info``, 8.0.RC2 and later: five ``Key : Value`` lines written from an
    indented heredoc (ATB's scripts/release.sh), ``    Ascend-cann-atb : <v>`` (the release),
    ``    Ascend-cann-atb Version : <v>.B<nnn>`` (the build), ``Platform``, ``branch``, ``commit id``. A source build
    of ATB writes no version line (its build.sh): the release is then the directory's name ``<v>`` (the link
    ``latest`` resolved). ``None`` when the file is absent."""
    path = os.path.join(version_dir, "version.info")
    text = _read(path)
    if text is None:
        return None
    record = parse_colon_values(text)
    return {"version": record.get("Ascend-cann-atb") or os.path.basename(os.path.realpath(version_dir)),
            "build": record.get("Ascend-cann-atb Version"), "platform": record.get("Platform"), "info_file": path}


def read_driver_info(path):
    """``driver/version.info``, every HDK line: ``Key=Value`` with mixed case (Version, ascendhal_version, ...,
    Innerversion, compatible_version, compatible_version_fw, package_version). The release is ``package_version``
    (24.1.rc2.2 and later), else ``Version`` (a 24.1.rc1 sample has no package_version; every sample with both
    has them equal). Sources: Ascend/mind-cluster's fault-diagnosis guide, hicann/pypto's FAQ, hicann/driver."""
    record = _record(path)
    if record is None:
        return {"installed": False, "version": None, "info_file": path}
    return {"installed": True, "version": record.get("package_version") or record.get("version"),
            "package_version": record.get("package_version"), "info_file": path}


def read_firmware_info(path):
    """``firmware/version.info``: ``Version=`` is the firmware build (7.1.0.11.220: the version in the firmware
    package's name, which roles/driver compares it with), ``package_version=`` the HDK release (23.0.7),
    ``firmware_version``, ``compatible_version_drv`` (Ascend/mind-cluster's fault-diagnosis guide)."""
    record = _record(path)
    if record is None:
        return {"installed": False, "version": None, "info_file": path}
    return {"installed": True, "version": record.get("version"), "package_version": record.get("package_version"),
            "info_file": path}


# --- paths ----------------------------------------------------------------------------------------------------

def _arch_dirs(root, host_arch):
    """``<arch>-linux`` directories under ``root``, the host's first."""
    try:
        names = sorted(name for name in os.listdir(root) if name.endswith("-linux"))
    except OSError:
        return []
    preferred = host_arch + "-linux"
    return sorted(names, key=lambda name: name != preferred)


def toolkit_version_dir(install_path, version):
    """``cann-<v>`` from 8.5, ``ascend-toolkit/<v>`` before (installation guides 8.0.0 and 8.5.0)."""
    if layout_of(version) == "cann":
        return os.path.join(install_path, f"cann-{version}")
    return os.path.join(install_path, "ascend-toolkit", version)


def uninstall_scripts(vdir, arch_dir, version):
    """The uninstallers of the toolkit of CANN ``version`` installed in ``vdir`` and of its kernels/ops:

    * toolkit, every line: ``<vdir>/<arch>-linux/script/uninstall.sh``; it removes the kernels/ops with it
      (installation guides 8.0.0 and 9.x, "uninstalling")
    * kernels before 8.5: ``ascend-toolkit/<v>/opp_kernel/script/uninstall.sh`` (8.0.0 guide); ops from 8.5:
      ``cann-<v>/<arch>-linux/script/ops_uninstall.sh`` (8.5.0 and 9.x guides)
    """
    if layout_of(version) == "cann":
        kernels = os.path.join(vdir, arch_dir, "script", "ops_uninstall.sh")
    else:
        kernels = os.path.join(vdir, "opp_kernel", "script", "uninstall.sh")
    return {"toolkit": os.path.join(vdir, arch_dir, "script", "uninstall.sh"), "kernels": kernels}


def nnal_uninstall_script(install_path, version):
    """NNAL's documented uninstaller: ``nnal/atb/<v>/scripts/uninstall.sh`` in the 8.0.RC3, 8.0.0 and 8.2 guides,
    ``nnal/nnal_uninstall.sh`` in the 8.5, 9.0 and 9.1 guides."""
    if layout_of(version) == "cann":
        return os.path.join(install_path, "nnal", "nnal_uninstall.sh")
    return os.path.join(install_path, "nnal", "atb", version, "scripts", "uninstall.sh")


def _real_dirs(pattern):
    """Real directories (no links) matching ``pattern`` that are versions: never ``latest`` (before 8.5
    ``ascend-toolkit/latest`` is a real directory the latest_manager keeps) nor ATB's ``<v>_recover`` backup."""
    return sorted(path for path in glob.glob(pattern)
                  if os.path.isdir(path) and not os.path.islink(path)
                  and os.path.basename(path) not in _NOT_VERSIONS and not path.endswith(_BACKUP_SUFFIX))


def _kernels_of(vdir, arch_dir, version):
    """The kernels (before 8.5) or ops (8.5+) record of the toolkit in ``vdir``, or ``None``."""
    if layout_of(version) == "cann":
        return read_ops_info(vdir, arch_dir)
    return read_kernels_info(os.path.join(vdir, "opp_kernel", "version.info"))


# --- the facts ------------------------------------------------------------------------------------------------

def _toolkit(install_path, host_arch):
    """The toolkit the links name (the last installed): through ``cann/`` (8.5 and later), else
    ``ascend-toolkit/latest/`` (before 8.5 a real directory of links; from 8.5 seen as a link to ``cann``)."""
    for home in ("cann", os.path.join("ascend-toolkit", "latest")):
        root = os.path.join(install_path, home)
        for arch_dir in _arch_dirs(root, host_arch):
            info_file = os.path.join(root, arch_dir, TOOLKIT_INFO)
            record = read_toolkit_info(info_file)
            if record is None:
                continue
            version = record["version"]
            vdir = toolkit_version_dir(install_path, version)
            if not os.path.isdir(vdir):
                vdir = os.path.realpath(root)
            return {
                "installed": True,
                "layout": layout_of(version),
                "version": version,
                "innerversion": record["innerversion"],
                "arch": record["arch"] or arch_dir[: -len("-linux")],
                "package_name": record["package_name"],
                "home": root,
                "version_dir": vdir,
                "arch_dir": arch_dir,
                "info_file": info_file,
                "uninstall_script": uninstall_scripts(vdir, arch_dir, version)["toolkit"],
            }
    return {"installed": False, "layout": None, "version": None}


def _kernels(toolkit):
    """The kernels (before 8.5) or ops (8.5+) package installed with the current toolkit."""
    if not toolkit["installed"]:
        return {"installed": False, "version": None}
    version, vdir, arch_dir = toolkit["version"], toolkit["version_dir"], toolkit["arch_dir"]
    record = _kernels_of(vdir, arch_dir, version)
    if record is None:
        return {"installed": False, "version": None}
    return dict(record, installed=True, component="ops" if layout_of(version) == "cann" else "kernels",
                uninstall_script=uninstall_scripts(vdir, arch_dir, version)["kernels"])


def _nnal(install_path):
    """The NNAL ``nnal/atb/latest`` names (the last installed)."""
    directory = os.path.join(install_path, "nnal", "atb", "latest")
    record = read_nnal_info(directory)
    if record is None:
        return {"installed": False, "version": None}
    return dict(record, installed=True, home=directory,
                uninstall_script=nnal_uninstall_script(install_path, record["version"]))


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


def _toolkit_versions(install_path, host_arch):
    """``{version: entry}`` of every toolkit version directory (``ascend-toolkit/<v>``, ``cann-<v>``) that holds a
    toolkit record, with its kernels/ops."""
    found = {}
    vdirs = _real_dirs(os.path.join(install_path, "ascend-toolkit", "*")) + _real_dirs(
        os.path.join(install_path, "cann-*"))
    for vdir in vdirs:
        for arch_dir in _arch_dirs(vdir, host_arch):
            record = read_toolkit_info(os.path.join(vdir, arch_dir, TOOLKIT_INFO))
            if record is None:
                continue
            version = record["version"]
            kernels = _kernels_of(vdir, arch_dir, version) or {}
            found[version] = {
                "layout": layout_of(version), "version_dir": vdir, "toolkit": version,
                "kernels": kernels.get("version"), "nnal": None,
                "uninstall_scripts": uninstall_scripts(vdir, arch_dir, version),
            }
            break
    return found


def installed_versions(install_path, host_arch):
    """``{version: {layout, version_dir, toolkit, kernels, nnal, set_env_scripts, uninstall_scripts}}`` of every
    CANN version installed side by side (``toolkit``/``kernels``/``nnal``: the installed version of that part or
    None; ``kernels`` is the ops package from 8.5); ``set_env_scripts`` are the existing ones of
    :func:`version_scripts`. ``uninstall_scripts``: the toolkit's and kernels/ops' (:func:`uninstall_scripts`) and
    NNAL's: that version's own ATB uninstaller ``nnal/atb/<v>/scripts/uninstall.sh``, documented before 8.5 and
    shipped by ATB in every line (9.1 included), which removes that version directory only. From 8.5 the guides
    name ``nnal/nnal_uninstall.sh`` (the ``nnal`` fact's ``uninstall_script``), which acts on NNAL as a whole."""
    found = _toolkit_versions(install_path, host_arch)
    for ndir in _real_dirs(os.path.join(install_path, "nnal", "atb", "*")):
        record = read_nnal_info(ndir)
        if record is None:
            continue
        version = record["version"]
        entry = found.setdefault(version, {"layout": layout_of(version), "version_dir": None, "toolkit": None,
                                           "kernels": None, "nnal": None, "uninstall_scripts": {}})
        entry["nnal"] = version
        entry["uninstall_scripts"]["nnal"] = os.path.join(ndir, "scripts", "uninstall.sh")
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
        "driver": read_driver_info(os.path.join(install_path, "driver", "version.info")),
        "firmware": read_firmware_info(os.path.join(install_path, "firmware", "version.info")),
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

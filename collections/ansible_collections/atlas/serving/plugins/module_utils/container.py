# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A container release (``serving_runtime: container``): the ``podman run`` command line the launcher execs,
and the checks around it. The one implementation; every flag and mount, with its source, is in
docs/containers.md.

* :func:`run_argv` builds the command line from a spec (the serving role renders it into the release's
  args file; a release's runtime is just its args).
* :func:`npus` picks the NPUs of the node's serving instance: ``ASCEND_RT_VISIBLE_DEVICES``'s ids, else all
  ``npu_count`` of them. :func:`container_env` is the environment the container gets: the same, less
  ``ASCEND_RT_VISIBLE_DEVICES`` (inside a container holding a subset of the NPUs the runtime numbers them
  from 0, so the host's ids would be refused: the device list selects them instead).
* :func:`env_file_problems`: values ``podman --env-file`` would not pass as systemd's EnvironmentFile does.
* :func:`chip_variant`, :func:`image_problems`: an image's variant and engine release against the node
  (preflight).
* :func:`inspect_problems`: what a running container was given (``podman inspect``) against its args file
  (``atlasctl doctor``).

Standard library only.
"""

from __future__ import annotations

import json
import posixpath
import re

from ansible_collections.atlas.serving.plugins.module_utils.manifest import IMAGE_VARIANTS as VARIANTS
from ansible_collections.atlas.serving.plugins.module_utils.manifest import is_image_id

DRIVER_DIR = "/usr/local/Ascend/driver"
# The official container run mounts (vllm-ascend quick start; docs/ascend-platform.md section 3), with the
# WHOLE driver directory instead of only lib64 and version.info: a partial driver mount is what breaks HCCL.
READ_ONLY_MOUNTS = (DRIVER_DIR, "/usr/local/bin/npu-smi", "/usr/local/dcmi", "/etc/ascend_install.info")
CONTROL_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
HCCN_CONF = "/etc/hccn.conf"
DEFAULT_HCCN_TOOL = DRIVER_DIR + "/tools/hccn_tool"
VISIBLE = "ASCEND_RT_VISIBLE_DEVICES"
_DAVINCI = re.compile(r"^/dev/davinci(\d+)$")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # fullmatch
_SIZE = re.compile(r"[0-9]+[bkmg]?")  # fullmatch
# What systemd's EnvironmentFile parses but podman --env-file takes literally (quotes, escapes, $): the
# env_lines filter quotes such values, so the engine would see the quotes.
_LITERAL_UNSAFE = re.compile(r"[\s\"'\\$]")


class ContainerError(ValueError):
    """A container spec that cannot be rendered; the message names the input and the fix."""


def davinci(npu):
    return f"/dev/davinci{int(npu)}"


def npus(env, npu_count):
    """The NPU ids of this node's serving instance: ``ASCEND_RT_VISIBLE_DEVICES`` of the release's environment
    when set (a subset), else 0 .. npu_count-1."""
    value = (env or {}).get(VISIBLE)
    if value is None or str(value).strip() == "":
        try:
            count = int(npu_count)
        except (TypeError, ValueError):
            raise ContainerError(f"the NPUs of a container release come from atlas_hardware.npu_count or {VISIBLE}; "
                                 f"npu_count is {npu_count!r}: set atlas_hardware.npu_count for this host") from None
        if count < 1:
            raise ContainerError(f"atlas_hardware.npu_count is {count}: a container release needs at least one NPU")
        return list(range(count))
    parts = [p.strip() for p in str(value).split(",")]
    if not all(p.isdigit() for p in parts):
        raise ContainerError(f"{VISIBLE}={value} is not a list of NPU ids (e.g. 0,1,2,3)")
    ids = [int(p) for p in parts]
    if len(set(ids)) != len(ids):
        raise ContainerError(f"{VISIBLE}={value} names an NPU twice")
    if npu_count not in (None, "") and any(i >= int(npu_count) for i in ids):
        raise ContainerError(f"{VISIBLE}={value} names an NPU the node does not have (atlas_hardware.npu_count "
                             f"{int(npu_count)}: ids 0..{int(npu_count) - 1})")
    return ids


def container_env(env):
    """The release's environment as the container gets it: ``ASCEND_RT_VISIBLE_DEVICES`` left out (the device
    list selects the NPUs; inside the container the runtime numbers the visible ones from 0)."""
    return {key: value for key, value in (env or {}).items() if key != VISIBLE}


def env_file_problems(env):
    """One sentence per variable whose value ``podman --env-file`` would not pass as written: podman takes
    ``KEY=value`` literally, so a value that needs systemd's quoting (whitespace, quotes, a backslash, ``$``)
    would reach the engine with the quotes."""
    problems = []
    for key in sorted(env or {}):
        value = env[key]
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if _LITERAL_UNSAFE.search(text):
            problems.append(f"{key}={text!r}: podman --env-file passes values literally, so this value (it has "
                            "whitespace, a quote, a backslash or $) would reach the engine with systemd's quoting")
    return problems


def host_paths(multinode=False, hccn_tool=""):
    """What a container release mounts or passes from the node besides its NPUs, the model and the release's own
    files: the driver and its tools, the control devices, and for a multi-node rank /etc/hccn.conf and hccn_tool.
    Preflight checks they exist (podman run fails at start on a missing one)."""
    paths = list(READ_ONLY_MOUNTS) + list(CONTROL_DEVICES)
    if multinode:
        paths += [HCCN_CONF, hccn_tool or DEFAULT_HCCN_TOOL]
    return paths


def _absolute(path, what):
    text = str(path or "")
    if not text.startswith("/") or "\n" in text or ":" in text or posixpath.normpath(text) != text.rstrip("/") or \
            text == "/":
        raise ContainerError(f"{what} {path!r} must be an absolute path without ':' (podman --volume SRC:DEST:ro)")
    return text


def _volume(source, dest=None, mode="ro"):
    return ["--volume", f"{source}:{dest or source}:{mode}"]


def run_argv(spec):
    """The ``podman run`` argv of a container release, from ``spec``:

    ``podman`` (path), ``name`` (the container: the service name), ``image_id`` (64 hex), ``npus`` (ids),
    ``multinode`` (a rank of an instance of two or more nodes: /etc/hccn.conf and ``hccn_tool`` mounted),
    ``hccn_tool`` (its path; under the driver directory it is mounted with it), ``model_source`` (the verified
    version directory) and ``model_path`` (where the engine's arguments name it), ``env_file``, ``keys_file``
    (the engine's --config file with the API keys, or empty), ``uid``, ``gid``, ``device_gid`` (numeric),
    (``ids_pending``: names allowed instead, check mode on a bare node), ``home`` (the serving user's home: a
    writable HOME and working directory), ``shm_size``, ``entrypoint``
    (the image's own engine executable, a list), ``extra`` (site flags before the image), ``command`` (the
    engine's arguments after its executable)."""
    podman = _absolute(spec.get("podman"), "podman")
    name = str(spec.get("name") or "")
    if not _NAME.fullmatch(name):
        raise ContainerError(f"container name {name!r}: letters, digits, '_', '.' and '-' (the service name)")
    image_id = str(spec.get("image_id") or "")
    if not is_image_id(image_id):
        raise ContainerError(f"image id {image_id!r} is not 64 hex digits (the image config's sha256 the bundle "
                             "manifest records): run the engines stage, which loads the image and records its id")
    npu_ids = list(spec.get("npus") or [])
    if not npu_ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in npu_ids):
        raise ContainerError(f"NPUs {npu_ids!r}: a container release is given at least one NPU id")
    ids = {}
    for key in ("uid", "gid", "device_gid"):
        value = spec.get(key)
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            ids[key] = value
        elif spec.get("ids_pending") and isinstance(value, str) and _NAME.fullmatch(value):
            ids[key] = value  # check mode on a node without the account or the driver yet: the names, for the diff
        else:
            raise ContainerError(f"{key} {value!r} is not a numeric id: it is read on the node (getent)")
    entrypoint = [str(part) for part in (spec.get("entrypoint") or [])]
    if not entrypoint or not entrypoint[0]:
        raise ContainerError("serving_image_entrypoint is empty: name the engine executable as the image has it "
                             "(e.g. [vllm], [python3]; docs/containers.md)")
    shm = str(spec.get("shm_size") or "")
    if shm and not _SIZE.fullmatch(shm):
        raise ContainerError(f"shm size {shm!r}: a number with an optional unit b, k, m or g (e.g. 1g)")
    home = _absolute(spec.get("home"), "serving_home")
    model_path = _absolute(spec.get("model_path"), "the model path")
    model_source = _absolute(spec.get("model_source") or model_path, "the model version directory")
    argv = [podman, "run", "--rm", "--init", "--replace", "--name", name, "--pull=never", "--network", "host"]
    argv += ["--user", f"{ids['uid']}:{ids['gid']}", "--group-add", str(ids["device_gid"])]
    for npu in npu_ids:
        argv += ["--device", davinci(npu)]
    for device in CONTROL_DEVICES:
        argv += ["--device", device]
    for path in READ_ONLY_MOUNTS:
        argv += _volume(path)
    if spec.get("multinode"):
        argv += _volume(HCCN_CONF)
        tool = _absolute(spec.get("hccn_tool") or DEFAULT_HCCN_TOOL, "hccn_tool")
        if not tool.startswith(DRIVER_DIR + "/"):
            argv += _volume(tool)
    argv += _volume(model_source, model_path)
    keys = spec.get("keys_file") or ""
    if keys:
        keys = _absolute(keys, "the API key file")
        argv += _volume(keys)
    argv += _volume(home, home, "rw")
    argv += ["--workdir", home, "--env", f"HOME={home}"]
    argv += ["--env-file", _absolute(spec.get("env_file"), "the env file")]
    if shm:
        argv += ["--shm-size", shm]
    argv += [str(part) for part in (spec.get("extra") or [])]
    argv += ["--entrypoint", json.dumps(entrypoint, separators=(",", ":")), image_id]
    argv += [str(part) for part in (spec.get("command") or [])]
    bad = [token for token in argv if any(ord(c) < 32 for c in token)]
    if bad:
        raise ContainerError(f"{bad[0]!r} has a control character: the args file holds one argument per line")
    return argv


def is_run_argv(argv):
    """True when an args file's argv is a container release's (``<podman> run ...``)."""
    return len(argv) > 1 and posixpath.basename(str(argv[0])) == "podman" and argv[1] == "run"


def _podman_part(argv):
    """The options of a ``podman run`` argv, up to the image (the engine's own flags after it are not podman's)."""
    if "--entrypoint" in argv:
        return argv[: argv.index("--entrypoint")]
    return argv


def argv_devices(argv):
    """The ``--device`` paths of a ``podman run`` argv (the engine's own flags are not read)."""
    part = _podman_part(argv)
    return [part[i + 1] for i, token in enumerate(part[:-1]) if token == "--device"]


def argv_npus(argv):
    """The NPU ids a ``podman run`` argv gives the container (its ``/dev/davinciN`` devices)."""
    return sorted(int(m.group(1)) for m in (_DAVINCI.match(d) for d in argv_devices(argv)) if m)


def chip_variant(name):
    """The image variant a chip needs, from the name ``npu-smi info`` prints: ``910B1``..``910B4`` (Atlas A2,
    the 910B family) -> ``910b``; ``Ascend910`` (Atlas A3 prints this name for each of its chips; sources
    in docs/containers.md) -> ``a3``; anything else -> None (not known: refused)."""
    text = str(name or "").strip()
    if re.match(r"^910B\d", text, re.IGNORECASE):
        return "910b"
    if text == "Ascend910":
        return "a3"
    return None


def image_problems(image, host, chips, engine_release):
    """Why ``image`` (a bundle manifest's image entry: name, variant, engine_release, ...) cannot serve on
    ``host`` with NPUs named ``chips`` (npu-smi) for a profile of ``engine_release``; one sentence each, naming
    the image, the node, both values and the fix."""
    problems = []
    name = image.get("name")
    names = sorted({str(c) for c in chips or []})
    wanted = sorted({chip_variant(c) or "" for c in names})
    if not names:
        problems.append(f"image {name}: {host} reports no NPU (npu-smi), so its chip family is unknown; a container "
                        "release runs only where the driver answers")
    elif "" in wanted:
        unknown = [c for c in names if chip_variant(c) is None]
        problems.append(f"image {name} is built for {image.get('variant')}, but {host}'s NPUs are "
                        f"{', '.join(unknown)}, a chip this suite does not map to an image variant "
                        f"({', '.join(VARIANTS)}); "
                        "serve this node from a venv release (serving_runtime: venv)")
    elif wanted != [image.get("variant")]:
        problems.append(f"image {name} is built for {image.get('variant')} (its CANN kernels), but {host}'s NPUs are "
                        f"{', '.join(names)}, which need an image of variant {'/'.join(wanted)}: put the "
                        f"{'/'.join(wanted)} image of "
                        "the same release in the bundle (e.g. quay.io/ascend/vllm-ascend:<v> for 910b, <v>-a3 for a3) "
                        "and set serving_image to it")
    if str(image.get("engine_release")) != str(engine_release):
        problems.append(f"image {name} runs {image.get('engine_release')}, but {host}'s serving profile is for "
                        f"{engine_release}: the profile's flags are linted against its release, so the image must run "
                        "the same one. Choose the image of that release, or a profile of the image's")
    return problems


def _mounts(inspect):
    return {str(m.get("Destination")): m for m in inspect.get("Mounts") or [] if isinstance(m, dict)}


def inspect_problems(inspect, argv, image_id):
    """What a running container (one object of ``podman inspect <name>``) lacks against the ``podman run`` argv
    of its release and the record's ``image_id``: (check, message, evidence) triples."""
    found = []
    host_config = inspect.get("HostConfig") or {}
    # PathInContainer: the suite gives each device at its own path (--device /dev/X), and that is what the engine
    # opens. PathOnHost is not reliable: Podman 4.3's inspect names a device by its major:minor, the first /dev entry
    # with those numbers (measured in the lab, whose NPU doubles are 1:3 like /dev/null: every PathOnHost read
    # /dev/null).
    seen = {str(d.get("PathInContainer") or d.get("PathOnHost")) for d in host_config.get("Devices") or []
            if isinstance(d, dict)}
    given = argv_devices(argv)
    missing = [d for d in given if d not in seen]
    if missing:
        found.append(("container-devices", f"the container lacks {', '.join(missing)} that its release gives it "
                      f"({len(argv_npus(argv))} NPU(s))",
                      f"podman inspect HostConfig.Devices (PathInContainer): {', '.join(sorted(seen)) or 'none'}; "
                      f"args: --device {' --device '.join(given)}"))
    extra = sorted(d for d in seen if _DAVINCI.match(d) and d not in given)
    if extra:
        found.append(("container-devices", f"the container holds {', '.join(extra)}, which its release does not give "
                      "it (NPUs of another instance?)",
                      f"podman inspect HostConfig.Devices (PathInContainer): {', '.join(sorted(seen))}"))
    mounts = _mounts(inspect)
    driver = mounts.get(DRIVER_DIR)
    if driver is None or driver.get("RW") is not False or driver.get("Source") != DRIVER_DIR:
        said = "not mounted" if driver is None else (
            f"mounted from {driver.get('Source')} {'read-write' if driver.get('RW') else 'read-only'}")
        partial = sorted(d for d in mounts if d.startswith(DRIVER_DIR + "/"))
        found.append(("container-driver-mount", f"{DRIVER_DIR} is {said} in the container, not the whole "
                      "directory "
                      "read-only"
                      + (f" (only {', '.join(partial)}: a partial driver mount breaks HCCL)" if partial else ""),
                      f"podman inspect Mounts: {', '.join(sorted(mounts)) or 'none'}"))
    running = str(inspect.get("Image") or "")
    if image_id and running != image_id:
        found.append(("container-image", f"the container runs image {running or '(none)'}, not {image_id}, the image "
                      "of its release", f"podman inspect .Image {running}; service record image_id {image_id}"))
    return found

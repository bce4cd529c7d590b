"""One SSH round trip per host: a shell script prints every evidence section between markers.

Secrets stay on the node: the env file's API key values (``*_API_KEY``, ``*_API_KEYS``, ``*APIKEY``, with
or without ``export``) and the values after ``--api-key`` in the args file (every one: vLLM's takes several)
are replaced by ``<redacted>`` there (sed), the engine's environ is filtered to ``ASCEND_*`` variables, the
keys file (the engine's ``--config``) is only stat'ed, and the HTTP probes send no key, except the hang
check's completion: it reads the engine's key on the node and sends it only to the engine, at the address
its service record names (``progress.local_url``), never printing it.

The bundle's ``manifest.json`` and ``manifest.json.asc`` (section ``bundle``, where the inventory names
``atlas_bundle_dir``) come back base64-encoded, byte for byte: the controller verifies the signature
against the pinned key (``atlasctl.doctor.checks.check_bundle_signed``).

The hang check (section ``hang``, on an entry node or a single node: where the service record exists
and is not a non-head rank) runs the collection's module_utils ``progress`` on the node: its source
and :data:`_HANG_PY` as one ``python3 -c`` program. It prints two ``/metrics`` samples ``window``
seconds apart and the outcome of a 1-token completion sent with the same deadline; the controller
judges them with the same file (``atlasctl.doctor.checks.check_instance_hung``).
"""

from __future__ import annotations

import functools
import re
import shlex
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

from ansible_collections.atlas.serving.plugins.module_utils import npu_procs, progress

from atlasctl.doctor.inventory import Target
from atlasctl.doctor.model import Evidence, Section
from atlasctl.layout import Layout, default_layout

MARK = "@@atlas-doctor@@"
_SECTION = re.compile(rf"^{re.escape(MARK)} (?P<name>[a-z_]+)$")
_RC = re.compile(rf"^{re.escape(MARK)}-rc (?P<name>[a-z_]+) (?P<rc>\d+)$")

# Both snippets take the layout's paths as arguments (python3 -c CODE ARG...).
_MODELS_PY = r"""
import glob, json, os, sys
models_root, stamp_dir = sys.argv[1], sys.argv[2]
out = []
for link in sorted(glob.glob(os.path.join(glob.escape(models_root), "*", "current"))):
    name = os.path.basename(os.path.dirname(link))
    item = {"name": name, "link": link, "target": None}
    if os.path.islink(link):
        target = os.readlink(link)
        vdir = os.path.normpath(os.path.join(os.path.dirname(link), target))
        version = os.path.basename(vdir)
        stamp_path = os.path.join(stamp_dir, "model-%s-%s.json" % (name, version))
        item.update(target=target, version=version, version_dir=vdir, stamp_path=stamp_path, stamp=None)
        try:
            with open(stamp_path) as fh:
                item["stamp"] = json.load(fh)
        except (OSError, ValueError) as exc:
            item["stamp_error"] = str(exc)
        files = {}
        for root, _dirs, names in os.walk(vdir):
            for fname in names:
                full = os.path.join(root, fname)
                st = os.lstat(full)
                files[os.path.relpath(full, vdir)] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                                      "ino": st.st_ino}
        item["files"] = files
    out.append(item)
print(json.dumps(out))
"""

# Appended to module_utils/progress.py's source (local_url is in scope): argv record.
_PROBE_PY = r"""
try:
    record = json.load(open(sys.argv[1]))
    port, url = int(record["port"]), local_url(record)
except (OSError, ValueError, KeyError, TypeError) as exc:
    print(json.dumps({"error": "no service record: %s" % exc})); raise SystemExit(0)
out = {"port": port, "url": url}
for path in ("/health", "/v1/models"):
    try:
        out[path] = urllib.request.urlopen(url + path, timeout=8).status
    except urllib.error.HTTPError as exc:
        out[path] = exc.code
    except Exception as exc:
        out[path] = "no answer: %s" % exc
print(json.dumps(out))
"""

# Appended to module_utils/progress.py's source (its names are in scope): argv record, args file, env file,
# window seconds. The completion has the window as its deadline and runs while the samples are taken.
_HANG_PY = r"""

def _flag_value(args, name):
    for index, token in enumerate(args):
        if token == name and index + 1 < len(args):
            return args[index + 1]
        if token.startswith(name + "="):
            return token[len(name) + 1:]
    return None


# The engine's first API key (the --config keys file, --api-key, a *_API_KEY line); never printed.
def _bearer(args_path, env_path):
    try:
        with open(args_path) as fh:
            args = [line.strip() for line in fh if line.strip() and not line.strip().startswith("#")]
    except OSError:
        args = []
    key = _flag_value(args, "--api-key")
    keys_file = _flag_value(args, "--config")
    if not key and keys_file:
        try:
            with open(keys_file) as fh:
                key = json.load(fh).get("api-key")
        except (OSError, ValueError, AttributeError):
            key = None
    key = (key or [None])[0] if isinstance(key, list) else key
    if not key:
        try:
            with open(env_path) as fh:
                found = [line.strip().split("=", 1)[1] for line in fh
                         if re.match(r"^(export )?[A-Z0-9_]*API_KEY=.", line.strip())]
        except OSError:
            found = []
        key = found[0].strip("'\"") if found else None
    return {"Authorization": "Bearer " + str(key)} if key else {}


def _hang_main(record_path, args_path, env_path, window_s):
    try:
        with open(record_path) as fh:
            record = json.load(fh)
        port, model = int(record["port"]), record["served_model_name"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {"skipped": "no service record: %s" % exc}
    instance = record.get("instance") if isinstance(record.get("instance"), dict) else {}
    if instance.get("entry") is False:
        return {"skipped": "rank %s of %s: checked on its entry %s" % (instance.get("rank"), instance.get("name"),
                                                                       instance.get("head"))}
    url = local_url(record)
    seen = observe(request, url, model, _bearer(args_path, env_path), record.get("engine"), "Hello", 1,
                   window_s, window_s, always=True)
    seen.pop("body", None)
    return dict(seen, url=url, record={"instance": instance} if instance else {})


print(json.dumps(_hang_main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))))
"""

_PATH = "PATH=$PATH:/usr/local/bin:/usr/local/sbin:/usr/local/Ascend/driver/tools; "


@functools.cache
def _collection_source(module: ModuleType) -> str:
    """A collection module_utils file's source as it is (standard library only): run on a node with
    ``python3 -c`` beside a small driver."""
    return Path(module.__file__).read_text(encoding="utf-8")


def _with_progress(driver: str) -> str:
    """A ``python3 -c`` program: module_utils/progress.py's source, then ``driver``."""
    return _collection_source(progress).rstrip("\n") + "\n\nimport sys\n" + driver


# Appended to module_utils/npu_procs.py's source (its names are in scope): argv engines root. The scan as JSON.
_NPU_PROCS_PY = r"""

import json
import sys

try:
    print(json.dumps(scan(sys.argv[1] if len(sys.argv) > 1 else "")))
except NpuFreeError as exc:
    print(json.dumps({"error": str(exc)}))
    sys.exit(1)
"""


def npu_procs_program() -> str:
    """The NPU process scan's ``python3 -c`` program: module_utils/npu_procs.py's source, then
    :data:`_NPU_PROCS_PY`."""
    return _collection_source(npu_procs).rstrip("\n") + "\n" + _NPU_PROCS_PY


def hang_program() -> str:
    """The hang check's ``python3 -c`` program: module_utils/progress.py's source, then :data:`_HANG_PY`."""
    return _with_progress(_HANG_PY)


def probe_program() -> str:
    """The HTTP probe's ``python3 -c`` program: module_utils/progress.py's source, then :data:`_PROBE_PY`."""
    return _with_progress(_PROBE_PY)


def bundle_snippet(bundle_dir: str) -> str:
    """Section ``bundle``: ``dir``, ``manifest`` and (when there is one) ``signature`` lines, the files base64."""
    from ansible_collections.atlas.serving.plugins.module_utils import signature as sig

    manifest, signature = f'"$d/{sig.MANIFEST_NAME}"', f'"$d/{sig.SIGNATURE_NAME}"'
    return (f"d={shlex.quote(bundle_dir)}; printf 'dir %s\\n' \"$d\"; "
            f"[ -f {manifest} ] || {{ echo \"no $d/{sig.MANIFEST_NAME}\"; exit 3; }}; "
            f"printf 'manifest '; base64 -w0 {manifest} || exit 4; echo; "
            f"[ -f {signature} ] || exit 0; printf 'signature '; base64 -w0 {signature} || exit 4; echo")


# Every NPU's board (npu-smi info -t board -i <id>, for each NPU ID of `npu-smi info -l`, NPU 0 when that lists
# none), one print after another, each followed by a blank line. npu-smi prints its `-t`/`-l` lines with a tab in
# front. A board that cannot be read prints one line without a colon in its place (parse.boards reads past it and
# doctor reports that NPU unread); the section fails only when no board could be read.
_BOARDS_SNIPPET = ("ids=$(npu-smi info -l 2>/dev/null "
                   "| sed -n 's/^[[:space:]]*NPU ID[[:space:]]*:[[:space:]]*\\([0-9]*\\).*/\\1/p'); "
                   "got=0; last=0; for id in ${ids:-0}; do "
                   "if out=$(npu-smi info -t board -i \"$id\" 2>&1); then printf '%s\\n\\n' \"$out\"; got=1; "
                   "else last=$?; printf 'npu-smi info -t board -i %s failed (rc %s)\\n\\n' \"$id\" \"$last\"; fi; "
                   "done; [ \"$got\" = 1 ] || exit \"$last\"")

# The engine's --config file (the serving role's keys file): its line after `--config`, or `--config=FILE`.
_KEYS_SNIPPET = ("k=$(sed -n -e '/^--config$/{{n;p;q;}}' -e 's/^--config=//p' {args} | head -n 1); "
                 "[ -n \"$k\" ] || exit 0; stat -L -c '%n %a %U %G' -- \"$k\"")


def snippets(layout: Layout | None = None, hang_window_s: float = 0.0,
             bundle_dir: str = "") -> tuple[tuple[str, str], ...]:
    """The evidence sections (name, bash snippet) for a node with ``layout`` (default: the default layout);
    ``hang_window_s`` above 0 adds the hang check (section ``hang``), ``bundle_dir`` the bundle's manifest and
    signature (section ``bundle``)."""
    layout = layout or default_layout()
    q = shlex.quote
    unit = q(f"{layout.service}.service")
    hang = (("hang", f"python3 -c {q(hang_program())} {q(layout.record)} {q(layout.args_file)} "
                     f"{q(layout.env_file)} {float(hang_window_s)!r}"),) if hang_window_s > 0 else ()
    bundle = (("bundle", bundle_snippet(bundle_dir)),) if bundle_dir else ()
    return (
        ("npu", _PATH + "command -v npu-smi >/dev/null || { echo 'npu-smi: command not found'; exit 127; }; "
                "npu-smi info"),
        ("board", _PATH + _BOARDS_SNIPPET),
        ("service", f"systemctl show {unit} --timestamp=unix --no-pager "
                    "-p LoadState,ActiveState,SubState,MainPID,NRestarts,Result,ExecMainStatus,ActiveEnterTimestamp"),
        ("record", f"cat {q(layout.record)}"),
        ("modes", f"stat -L -c '%n %a %U %G' {q(layout.env_file)} {q(layout.args_file)}"),
        ("keys", _KEYS_SNIPPET.format(args=q(layout.args_file))),
        ("env", r"sed -E 's/^((export[[:space:]]+)?[A-Za-z0-9_]*(API_?KEYS?|api_?keys?)=).*/\1<redacted>/' "
                + q(layout.env_file)),
        ("args", r"sed -E -e '/^--api-key$/,/^--/{/^--/!s/.*/<redacted>/}' -e 's/^(--api-key=).*/\1<redacted>/' "
                 + q(layout.args_file)),
        ("environ", f"pid=$(systemctl show -p MainPID --value {unit}); "
                    f"[ \"${{pid:-0}}\" != 0 ] || {{ echo {q(layout.service + ' has no main process')}; exit 3; }}; "
                    "e=$(tr '\\0' '\\n' < /proc/$pid/environ) || exit 4; "
                    "printf '%s\\n' \"$e\" | grep -E '^ASCEND_[A-Z0-9_]*=' || true"),
        ("journal", f"journalctl -u {unit} -n 300 --no-pager -o short-unix"),
        ("versions", "for f in /usr/local/Ascend/driver/version.info /usr/local/Ascend/firmware/version.info "
                     "/usr/local/Ascend/cann/*-linux/ascend_toolkit_install.info "
                     "/usr/local/Ascend/ascend-toolkit/latest/*-linux/ascend_toolkit_install.info; "
                     "do [ -r \"$f\" ] && { echo \"== $f\"; cat \"$f\"; }; done; true"),
        # the CANN environment scripts the running release pins (roles/serving, <service>.cann), each present or not
        ("cann_pin", f"f={q(layout.config_dir + '/' + layout.service + '.cann')}; [ -r \"$f\" ] || exit 0; "
                     "grep -v '^#' \"$f\" | while IFS= read -r s; do [ -n \"$s\" ] || continue; "
                     "if [ -r \"$s\" ]; then echo \"present $s\"; else echo \"missing $s\"; fi; done"),
        ("models", f"python3 -c {q(_MODELS_PY)} {q(layout.models_root)} {q(layout.stamp_dir)}"),
        ("probe", f"python3 -c {q(probe_program())} {q(layout.record)}"),
        ("npu_procs", f"python3 -c {q(npu_procs_program())} {q(layout.engines_root)}"),
        # a container release only (the record says runtime container): what Podman gave the container
        ("container", f"grep -q '\"runtime\": \"container\"' {q(layout.record)} 2>/dev/null || exit 0; "
                      f"podman inspect --type container {q(layout.service)}"),
    ) + hang + bundle


def script(sections: tuple[tuple[str, str], ...] | None = None) -> str:
    sections = sections if sections is not None else snippets()
    parts = ["exec 2>&1"]
    for name, snippet in sections:
        parts.append(f"printf '%s\\n' '{MARK} {name}'; ( {snippet} ); "
                     f"rc=$?; printf '\\n%s\\n' \"{MARK}-rc {name} $rc\"")
    return "\n".join(parts) + "\n"


def split_sections(host: str, output: str, layout: Layout | None = None) -> Evidence:
    """The script's output -> Evidence; a section without its rc line counts as rc 255."""
    sections: dict[str, Section] = {}
    name: str | None = None
    lines: list[str] = []
    for line in output.splitlines():
        start, end = _SECTION.match(line), _RC.match(line)
        if start:
            name, lines = start.group("name"), []
        elif end and name == end.group("name"):
            text = "\n".join(lines)
            sections[name] = Section(int(end.group("rc")), text[:-1] if text.endswith("\n") else text)
            name = None
        elif name is not None:
            lines.append(line)
    if name is not None:
        sections[name] = Section(255, "\n".join(lines))
    return Evidence(host, sections, layout or default_layout())


Runner = Callable[[Target, str], str]


def gather_one(target: Target, run: Runner, hang_window_s: float = 0.0) -> Evidence:
    sections = snippets(target.layout, hang_window_s, target.bundle_dir)
    return split_sections(target.name, run(target, script(sections)), target.layout)


def gather_all(targets: list[Target], run: Runner, workers: int = 16, hang_window_s: float = 0.0
               ) -> tuple[dict[str, Evidence], dict[str, str], float]:
    """Evidence per reachable host, error per unreachable host, wall seconds; ``hang_window_s`` above 0
    adds the hang check (its window runs on every host at once)."""
    started = time.monotonic()
    evidence: dict[str, Evidence] = {}
    errors: dict[str, str] = {}
    if not targets:
        return evidence, errors, 0.0
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(targets)))) as pool:
        futures = {t.name: pool.submit(gather_one, t, run, hang_window_s) for t in targets}
        for name, future in futures.items():
            try:
                evidence[name] = future.result()
            except Exception as exc:  # noqa: BLE001 - any SSH failure makes the host unreachable
                errors[name] = f"{type(exc).__name__}: {exc}".strip()
    return evidence, errors, time.monotonic() - started

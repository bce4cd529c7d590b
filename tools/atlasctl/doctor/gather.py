"""One SSH round trip per host: a shell script prints every evidence section between markers.

Secrets stay on the node: the env file's ``*_API_KEY`` values and the values after ``--api-key``
in the args file (every one: vLLM's takes several) are replaced by ``<redacted>`` there (sed), the
engine's environ is filtered to ``ASCEND_*`` variables, and the HTTP probes send no key.
"""

from __future__ import annotations

import inspect
import re
import shlex
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from atlasctl.collection import module_utils
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

_PROBE_PY = r"""
import json, sys, urllib.error, urllib.request
try:
    port = int(json.load(open(sys.argv[1]))["port"])
except (OSError, ValueError, KeyError) as exc:
    print(json.dumps({"error": "no service record: %s" % exc})); raise SystemExit(0)
out = {"port": port}
for path in ("/health", "/v1/models"):
    try:
        out[path] = urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=8).status
    except urllib.error.HTTPError as exc:
        out[path] = exc.code
    except Exception as exc:
        out[path] = "no answer: %s" % exc
print(json.dumps(out))
"""

_PATH = "PATH=$PATH:/usr/local/bin:/usr/local/sbin:/usr/local/Ascend/driver/tools; "


def _npu_procs_py() -> str:
    """The collection's npu_procs.py as it is (standard library only): run with ``python3 -c`` it prints
    the processes holding an NPU or running an engine (the same scan as the module npu_free)."""
    return inspect.getsource(module_utils("npu_procs"))


def snippets(layout: Layout | None = None) -> tuple[tuple[str, str], ...]:
    """The evidence sections (name, bash snippet) for a node with ``layout`` (default: the default layout)."""
    layout = layout or default_layout()
    q = shlex.quote
    unit = q(f"{layout.service}.service")
    return (
        ("npu", _PATH + "command -v npu-smi >/dev/null || { echo 'npu-smi: command not found'; exit 127; }; "
                "npu-smi info"),
        ("board", _PATH + "id=$(npu-smi info -l 2>/dev/null "
                  "| sed -n 's/^ *NPU ID *: *\\([0-9]*\\).*/\\1/p' | head -n 1); "
                  "npu-smi info -t board -i \"${id:-0}\""),
        ("service", f"systemctl show {unit} --timestamp=unix --no-pager "
                    "-p LoadState,ActiveState,SubState,MainPID,NRestarts,Result,ExecMainStatus,ActiveEnterTimestamp"),
        ("record", f"cat {q(layout.record)}"),
        ("modes", f"stat -L -c '%n %a %U %G' {q(layout.env_file)} {q(layout.args_file)}"),
        ("env", rf"sed -E 's/^([A-Z0-9_]*API_KEY=).*/\1<redacted>/' {q(layout.env_file)}"),
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
        ("models", f"python3 -c {q(_MODELS_PY)} {q(layout.models_root)} {q(layout.stamp_dir)}"),
        ("probe", f"python3 -c {q(_PROBE_PY)} {q(layout.record)}"),
        ("npu_procs", f"python3 -c {q(_npu_procs_py())} {q(layout.engines_root)}"),
    )


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


def gather_one(target: Target, run: Runner) -> Evidence:
    return split_sections(target.name, run(target, script(snippets(target.layout))), target.layout)


def gather_all(targets: list[Target], run: Runner, workers: int = 16
               ) -> tuple[dict[str, Evidence], dict[str, str], float]:
    """Evidence per reachable host, error per unreachable host, wall seconds."""
    started = time.monotonic()
    evidence: dict[str, Evidence] = {}
    errors: dict[str, str] = {}
    if not targets:
        return evidence, errors, 0.0
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(targets)))) as pool:
        futures = {t.name: pool.submit(gather_one, t, run) for t in targets}
        for name, future in futures.items():
            try:
                evidence[name] = future.result()
            except Exception as exc:  # noqa: BLE001 - any SSH failure makes the host unreachable
                errors[name] = f"{type(exc).__name__}: {exc}".strip()
    return evidence, errors, time.monotonic() - started

"""One SSH round trip per host: a shell script prints every evidence section between markers.

Secrets stay on the node: the env file's ``*_API_KEY`` values and the values after ``--api-key``
in the args file (every one: vLLM's takes several) are replaced by ``<redacted>`` there (sed), the
engine's environ is filtered to ``ASCEND_*`` variables, and the HTTP probes send no key.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from atlasctl.doctor.inventory import Target
from atlasctl.doctor.model import Evidence, Section

MARK = "@@atlas-doctor@@"
_SECTION = re.compile(rf"^{re.escape(MARK)} (?P<name>[a-z_]+)$")
_RC = re.compile(rf"^{re.escape(MARK)}-rc (?P<name>[a-z_]+) (?P<rc>\d+)$")

_MODELS_PY = r"""
import glob, json, os
out = []
for link in sorted(glob.glob("/var/lib/atlas/models/*/current")):
    name = os.path.basename(os.path.dirname(link))
    item = {"name": name, "link": link, "target": None}
    if os.path.islink(link):
        target = os.readlink(link)
        vdir = os.path.normpath(os.path.join(os.path.dirname(link), target))
        version = os.path.basename(vdir)
        stamp_path = "/var/lib/atlas/stamps/model-%s-%s.json" % (name, version)
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
import json, urllib.error, urllib.request
try:
    port = int(json.load(open("/etc/atlas/serving/atlas-serving.json"))["port"])
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

SECTIONS: tuple[tuple[str, str], ...] = (
    ("npu", "PATH=$PATH:/usr/local/bin:/usr/local/sbin:/usr/local/Ascend/driver/tools; "
            "command -v npu-smi >/dev/null || { echo 'npu-smi: command not found'; exit 127; }; npu-smi info"),
    ("board", "PATH=$PATH:/usr/local/bin:/usr/local/sbin:/usr/local/Ascend/driver/tools; "
              "id=$(npu-smi info -l 2>/dev/null | sed -n 's/^ *NPU ID *: *\\([0-9]*\\).*/\\1/p' | head -n 1); "
              "npu-smi info -t board -i \"${id:-0}\""),
    ("service", "systemctl show atlas-serving.service --timestamp=unix --no-pager "
                "-p LoadState,ActiveState,SubState,MainPID,NRestarts,Result,ExecMainStatus,ActiveEnterTimestamp"),
    ("record", "cat /etc/atlas/serving/atlas-serving.json"),
    ("modes", "stat -L -c '%n %a %U %G' /etc/atlas/serving/atlas-serving.env /etc/atlas/serving/atlas-serving.args"),
    ("env", r"sed -E 's/^([A-Z0-9_]*API_KEY=).*/\1<redacted>/' /etc/atlas/serving/atlas-serving.env"),
    ("args", r"sed -E -e '/^--api-key$/,/^--/{/^--/!s/.*/<redacted>/}' -e 's/^(--api-key=).*/\1<redacted>/' "
             "/etc/atlas/serving/atlas-serving.args"),
    ("environ", "pid=$(systemctl show -p MainPID --value atlas-serving.service); "
                "[ \"${pid:-0}\" != 0 ] || { echo 'atlas-serving has no main process'; exit 3; }; "
                "e=$(tr '\\0' '\\n' < /proc/$pid/environ) || exit 4; "
                "printf '%s\\n' \"$e\" | grep -E '^ASCEND_[A-Z0-9_]*=' || true"),
    ("journal", "journalctl -u atlas-serving.service -n 300 --no-pager -o short-unix"),
    ("versions", "for f in /usr/local/Ascend/driver/version.info /usr/local/Ascend/firmware/version.info "
                 "/usr/local/Ascend/cann/*-linux/ascend_toolkit_install.info "
                 "/usr/local/Ascend/ascend-toolkit/latest/*-linux/ascend_toolkit_install.info; "
                 "do [ -r \"$f\" ] && { echo \"== $f\"; cat \"$f\"; }; done; true"),
    ("models", "python3 -c " + shlex.quote(_MODELS_PY)),
    ("probe", "python3 -c " + shlex.quote(_PROBE_PY)),
)


def script(sections: tuple[tuple[str, str], ...] = SECTIONS) -> str:
    parts = ["exec 2>&1"]
    for name, snippet in sections:
        parts.append(f"printf '%s\\n' '{MARK} {name}'; ( {snippet} ); "
                     f"rc=$?; printf '\\n%s\\n' \"{MARK}-rc {name} $rc\"")
    return "\n".join(parts) + "\n"


def split_sections(host: str, output: str) -> Evidence:
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
    return Evidence(host, sections)


Runner = Callable[[Target, str], str]


def gather_one(target: Target, run: Runner) -> Evidence:
    return split_sections(target.name, run(target, script()))


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

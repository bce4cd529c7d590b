# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A rollout's evidence pack (docs/evidence.md): what ran on which node, from which signed bundle, and
which gates it passed, as one directory an auditor can check offline.

The pack is ``evidence.json`` (the record), ``SHA256SUMS`` (every other file of the pack, as ``sha256sum``
writes it) and ``SHA256SUMS.asc`` (a detached signature of SHA256SUMS by the controller's own key, named
in the inventory: ``atlas_evidence_signing_key``, ``atlas_evidence_gnupg_home``). It is written on the
controller by the module ``atlas.serving.rollout_evidence`` (playbooks/rollout.yml: after the plan, after
every batch, after the last wave), each time whole, and read by ``atlasctl evidence verify|show``.

The record is bound to its rollout (``binding``, format 2): it names the rollout (the pack's folder name
without ``.evidence``), the folder of the inventory's rollouts it was written in, and, once ``atlasctl rollout``
has written its report, the report's name and sha256. A genuine pack copied into another rollout's folder, or
laid beside another report, no longer matches where it sits. A format-1 pack names none of these: it is
"unbound, older format".

What goes in is picked by name (``node_entry``), never copied wholesale from a host's variables, and every
string in it is cleared of the values of the host's secret variables (``secret_values``): a key is never
in a pack, only the sha256 of the files that carry one.

Standard library only.
"""

from __future__ import annotations

import datetime
import getpass
import hashlib
import json
import os
import re
import shutil
import socket

from ansible_collections.atlas.serving.plugins.module_utils import signature
from ansible_collections.atlas.serving.plugins.module_utils.checksums import file_sha256

FORMAT_V1 = "atlas-serving rollout evidence 1"  # no binding: any rollout's folder takes it
FORMAT = "atlas-serving rollout evidence 2"  # bound: the record names its rollout and its report's sha256
FORMATS = (FORMAT_V1, FORMAT)
MAX_DEPTH = 64  # a record nested deeper is refused before it is parsed (json recurses once per level)
RECORD = "evidence.json"
SUMS = "SHA256SUMS"
SIGNATURE = "SHA256SUMS.asc"
SUFFIX = ".evidence"
WITHHELD = "[secret withheld]"
UNSIGNED_NOTE = ("UNSIGNED: no atlas_evidence_signing_key is named in the inventory, so nothing vouches for this "
                 "pack; name the controller's evidence key (docs/evidence.md)")

# The gates of a node, in the order playbooks/rollout/tasks/node.yml passes them (`rollout_gate`).
GATES = ("previous", "network", "drain", "stop", "driver", "network-after", "cann", "stage", "restart", "health",
         "slo", "enable")
# The gates of a platform move (playbooks/rollout/tasks/platform.yml): run only where the release moves the platform.
PLATFORM_GATES = ("stop", "driver", "network-after", "cann")
# Gates a node converged on the release already (a --resume) does not run.
CONVERGED_SKIPS = ("network", "drain", "stage", "restart", *PLATFORM_GATES)

# Variables whose values are secrets, by name (serving_api_key, serving_api_keys, vault_*_api_key,
# ansible_password, ...), and the names of environment entries that carry one (VLLM_API_KEY, HF_TOKEN, ...).
SECRET_NAME = re.compile(r"api_?keys?|passw(or)?d|passphrase|secret|token|_pass$", re.IGNORECASE)
SECRET_ENV_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL", re.IGNORECASE)
ENV_VARS = ("serving_env_extra",)
SECRET_MIN_LEN = 6  # shorter values (a flag, a count) are not withheld from every string: they are not keys

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class EvidenceError(ValueError):
    """A pack that cannot be written or read; the message names the file."""


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------- where packs go

def inventory_key(inventory: str) -> str:
    """``<inventory name>-<10 hex>``: the folder of an inventory's rollouts (lock, state, reports, packs)."""
    path = str(inventory)
    return f"{os.path.basename(path.rstrip('/'))}-{hashlib.sha256(path.encode()).hexdigest()[:10]}"


def run_stem(started_at: str, release: str) -> str:
    """``<YYYYmmddTHHMMSSZ>-<release>``: the report's name and its pack's, beside each other."""
    return f"{started_at.replace(':', '').replace('-', '')}-{_SAFE.sub('_', str(release))}"


def pack_dir(root: str, inventory: str, started_at: str, release: str) -> str:
    """Where a rollout's pack goes: ``<root>/<inventory_key>/<run_stem>.evidence``."""
    return os.path.join(root, inventory_key(inventory), run_stem(started_at, release) + SUFFIX)


def rollout_of(folder: str) -> tuple[str, str]:
    """(rollout id, folder of the inventory's rollouts) a pack's directory names: ``<run_stem>`` of
    ``.../<inventory_key>/<run_stem>.evidence``."""
    path = os.path.abspath(folder)
    name = os.path.basename(path)
    rollout = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name
    return rollout, os.path.basename(os.path.dirname(path))


def binding(folder: str, report_sha256: str | None = None) -> dict:
    """What ties a record to its rollout: its id and folder (where the pack is written) and, when
    ``atlasctl rollout`` wrote one, its report's name and sha256."""
    rollout, where = rollout_of(folder)
    return {"rollout": rollout, "rollouts_folder": where, "report": rollout + ".json",
            "report_sha256": report_sha256 or None}


# ---------------------------------------------------------------- secrets

def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, str)]
    return []


def _get(hostvars, name):
    """A variable of a host, templated by Ansible on access; one that cannot be read is absent."""
    try:
        return hostvars[name] if name in hostvars else None
    except Exception:  # noqa: BLE001 (an undefined vault or template: not a value to withhold)
        return None


def secret_values(hostvars) -> set[str]:
    """The values of a host's secret variables (by name) and of its secret environment entries."""
    found: set[str] = set()
    for name in list(hostvars):
        if isinstance(name, str) and SECRET_NAME.search(name):
            found.update(_strings(_get(hostvars, name)))
    for name in ENV_VARS:
        env = _get(hostvars, name)
        if isinstance(env, dict):
            found.update(v for k, v in env.items() if isinstance(v, str) and SECRET_ENV_NAME.search(str(k)))
    return {value for value in found if len(value) >= SECRET_MIN_LEN}


def redact(value, secrets: set[str]):
    """``value`` with every occurrence of a secret in its strings (keys included) replaced by WITHHELD."""
    if not secrets:
        return value
    if isinstance(value, str):
        for secret in sorted(secrets, key=len, reverse=True):
            value = value.replace(secret, WITHHELD)
        return value
    if isinstance(value, dict):
        return {redact(k, secrets): redact(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, secrets) for v in value]
    return value


# ---------------------------------------------------------------- one node

def _pick(source, *names):
    source = source if isinstance(source, dict) else {}
    return {name: source.get(name) for name in names if source.get(name) is not None}


def _health_figures(probe) -> dict:
    probe = probe if isinstance(probe, dict) else {}
    out = _pick(probe, "health", "waited_s", "completion_tokens", "unit", "headless")
    progress = probe.get("progress") if isinstance(probe.get("progress"), dict) else {}
    out.update({f"hang_{k}": v for k, v in _pick(progress, "verdict", "reason").items()})
    return out


def _slo_figures(measured) -> dict:
    return _pick(measured, "completed", "failed", "violations", "metrics", "thresholds", "prometheus")


def _versions(hostvars) -> dict:
    """What the node runs, read back: the service record of its last health probe (the gate's; after a
    rollback, the previous release's), the CANN stack's versions (ansible_facts.cann)."""
    facts = _get(hostvars, "ansible_facts") or {}
    cann = facts.get("cann") if isinstance(facts, dict) else None
    cann = cann if isinstance(cann, dict) else {}
    probe = _get(hostvars, "health_probe") or {}
    record = probe.get("record") if isinstance(probe, dict) and isinstance(probe.get("record"), dict) else {}
    out = {part: (cann.get(part) or {}).get("version") for part in ("driver", "firmware", "toolkit", "kernels", "nnal")
           if isinstance(cann.get(part), dict) and (cann.get(part) or {}).get("installed")}
    out = {("cann" if k == "toolkit" else k): v for k, v in out.items()}
    out.update(_pick(record, "release_id", "engine", "engine_release", "runtime", "image", "image_id", "profile",
                     "served_model_name", "model_path", "model_version", "port"))
    return out


def _files(hostvars) -> dict:
    """{file: sha256} of the release's rendered files read back on the node (playbooks/rollout/tasks/readback.yml:
    a find with sha256 checksums)."""
    read = _get(hostvars, "rollout_readback") or {}
    found = read.get("files") if isinstance(read, dict) else None
    return {os.path.basename(str(f.get("path"))): f.get("checksum") for f in found or []
            if isinstance(f, dict) and f.get("path")}


def _gates(result: str, converged: bool, unit: list, failure: dict, health: dict, slo: dict,
           platform: dict | None = None) -> list[dict]:
    """Each gate of node.yml with its result: passed (with its figures), failed (why, what it measured),
    skipped on a converged node or where the platform does not move, or not run after the one that failed."""
    failed_at = failure.get("gate") if failure else None
    platform = platform if isinstance(platform, dict) else {}
    ran_platform = {"stop": bool(platform.get("stop")), "driver": bool(platform.get("hdk")),
                    "network-after": bool(platform.get("hdk")), "cann": bool(platform.get("cann"))}
    out, past = [], False
    for gate in GATES:
        if gate in ("network", "network-after") and len(unit) < 2:
            continue
        if gate in PLATFORM_GATES and not ran_platform[gate] and gate != failed_at:
            continue
        row: dict = {"gate": gate}
        if past or result not in ("ok", "failed"):
            row["result"] = "not run"
        elif gate == failed_at:
            row.update(result="failed", why=failure.get("why", ""), task=failure.get("task", ""))
            if gate == "slo":
                row["figures"] = _slo_figures(failure.get("measured"))
            past = True
        elif converged and gate in CONVERGED_SKIPS:
            row["result"] = "skipped: converged on the release already"
        else:
            row["result"] = "passed"
            figures = health if gate == "health" else slo if gate == "slo" else {}
            if figures:
                row["figures"] = figures
            elif gate == "slo" and len(unit) > 1:
                row["result"] = "passed (the load ran at the instance's entry)"
        out.append(row)
    return out


def node_entry(host: str, hostvars, *, wave: str = "", skipped: bool = False, dropped: bool = False) -> dict:
    """One node's part of the record, picked by name from its variables (``nodes`` withholds the secrets)."""
    report = _get(hostvars, "rollout_node_report")
    report = report if isinstance(report, dict) else {}
    failure = _get(hostvars, "rollout_failure")
    failure = failure if isinstance(failure, dict) else {}
    if failure:
        result = "failed"
    elif report:
        result = "ok"
    elif skipped:
        result = "skipped"
    elif dropped:
        result = "lost"
    else:
        result = "not reached"
    ran = result in ("ok", "failed")
    unit = report.get("unit") or failure.get("unit") or _get(hostvars, "rollout_unit") or [host]
    unit = list(unit) if isinstance(unit, (list, tuple)) else [str(unit)]
    converged = bool(_get(hostvars, "rollout_converged")) if ran else False
    entry = {
        "host": host,
        "wave": report.get("wave") or failure.get("wave") or wave,
        "result": result,
        "previous": report.get("previous") or failure.get("previous") or _get(hostvars, "rollout_previous_release"),
        "release": report.get("release") or failure.get("release"),
        "converged": converged,
        "unit": unit,
        "at": report.get("at") or failure.get("at"),
        "bundle": {"manifest_sha256": _get(hostvars, "atlas_bundle_manifest_sha256"),
                   "signed_by": _get(hostvars, "atlas_bundle_signer")},
        # what the node runs at the end of its part: the release, or after a rollback the previous one
        "versions": _versions(hostvars) if ran else {},
        "files_sha256": _files(hostvars) if result == "ok" else {},
        "gates": _gates(result, converged, unit, failure, _health_figures(_get(hostvars, "rollout_health_probe")),
                        _slo_figures(report.get("slo")), _get(hostvars, "rollout_platform")) if ran else [],
    }
    if skipped:
        entry["note"] = "its wave completed in an earlier run (--resume)"
    elif result == "lost":
        entry["note"] = "unreachable (or failed outside the gates) during its wave: not rolled back by the run"
    if failure:
        entry["rollback"] = {**_pick(failure, "gate", "why", "task", "previous", "via_unit", "lost", "converged"),
                             "running_after": entry["versions"].get("release_id")}
    return entry


def nodes(hostvars, plan: list, dropped: list | None = None) -> list[dict]:
    """Every host of the plan, in wave order (a host runs in its first wave only), each picked by name
    (node_entry), with the values of every host's secret variables withheld from all of them."""
    seen, out, secrets = set(), [], set()
    for wave in plan or []:
        for host in wave.get("hosts") or []:
            if host in seen:
                continue
            seen.add(host)
            hv = hostvars[host] if host in hostvars else {}
            secrets |= secret_values(hv)
            out.append(node_entry(host, hv, wave=wave.get("name", ""), skipped=bool(wave.get("skipped")),
                                  dropped=host in (dropped or [])))
    return redact(out, secrets)


# ---------------------------------------------------------------- the record

def _one_or_all(values: list) -> object:
    distinct = sorted({v for v in values if v})
    return distinct[0] if len(distinct) == 1 else distinct


def build_record(inputs: dict, *, signing_key: str = "", gnupg_home: str = "", now: str | None = None) -> dict:
    """The record: what the playbook gathered (``inputs``), with the outcome, the rollbacks, the bundle
    across the nodes and the controller (hostname, user) added.

    A node that failed or was lost stops the rollout after its batch (playbooks/rollout/tasks/node.yml), so
    a record with one is the run's last: complete, as the write after the last wave is."""
    entries = [dict(n) for n in inputs.get("nodes") or []]
    results = [n.get("result") for n in entries]
    if any(r in ("failed", "lost") for r in results) or inputs.get("failure"):
        status = "failed"
    elif inputs.get("complete"):
        status = "ok" if all(r in ("ok", "skipped") for r in results) else "failed"
    else:
        status = "in progress"
    complete = bool(inputs.get("complete")) or status == "failed"
    for entry in entries:
        if complete and entry.get("result") == "not reached" and "note" not in entry:
            entry["note"] = ("no wave reached it: the bundle's signature was not verified on it in this run"
                             if not (entry.get("bundle") or {}).get("manifest_sha256")
                             else "no wave reached it: the rollout stopped before its wave")
    now = now or utc_now()
    record = {
        "format": FORMAT,
        "release": inputs.get("release"),
        "status": status,
        "complete": complete,
        "inventory": inputs.get("inventory"),
        "controller": {"hostname": socket.gethostname(), "user": getpass.getuser(),
                       "sudo_user": os.environ.get("SUDO_USER") or None},
        "started_at": inputs.get("started_at"),
        "updated_at": now,
        "ended_at": now if complete else None,
        "resumed_from": inputs.get("resumed_from") or None,
        "plan": inputs.get("plan") or [],
        "bundle": {"manifest_sha256": _one_or_all([n.get("bundle", {}).get("manifest_sha256") for n in entries]),
                   "signed_by": _one_or_all([n.get("bundle", {}).get("signed_by") for n in entries])},
        "nodes": entries,
        "rollbacks": [{"host": n["host"], "wave": n.get("wave"), **n["rollback"]} for n in entries
                      if n.get("rollback")],
        "signature": ({"signed": True, "key": signing_key, "gnupg_home": gnupg_home} if signing_key
                      else {"signed": False, "note": UNSIGNED_NOTE}),
    }
    if inputs.get("failure"):
        record["failure"] = inputs["failure"]
    return record


# ---------------------------------------------------------------- SHA256SUMS

def sums_text(files: dict[str, bytes]) -> str:
    """``<sha256>  <name>`` per file, sorted, as ``sha256sum`` writes them (``sha256sum -c`` reads it)."""
    return "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in sorted(files.items()))


def parse_sums(text: str) -> dict[str, str]:
    """{name: sha256} from SHA256SUMS; a line that is not ``<64 hex>  <plain name>`` is an EvidenceError."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep:
            digest, sep, name = line.partition(" *")
        if not sep or not _HEX64.match(digest) or not name or "/" in name or name in (".", "..") or name in out:
            raise EvidenceError(f"{SUMS} line {number}: {line[:120]!r} is not '<sha256>  <file of the pack>'")
        out[name] = digest
    return out


def check_files(folder: str) -> list[tuple[str, str]]:
    """(file, what is wrong) for every file SHA256SUMS lists that is missing or changed, and every file of the
    pack it does not list; [] when they all match. SHA256SUMS itself unreadable: an EvidenceError."""
    try:
        with open(os.path.join(folder, SUMS), "rb") as handle:
            listed = parse_sums(handle.read().decode("utf-8"))
    except FileNotFoundError:
        raise EvidenceError(f"{SUMS}: missing, so nothing in the pack can be checked") from None
    except UnicodeDecodeError:
        raise EvidenceError(f"{SUMS}: not UTF-8 text") from None
    problems = []
    for name, digest in sorted(listed.items()):
        path = os.path.join(folder, name)
        if os.path.islink(path) or (os.path.exists(path) and not os.path.isfile(path)):
            problems.append((name, "not a plain file"))
        elif not os.path.exists(path):
            problems.append((name, "missing (listed in SHA256SUMS)"))
        else:
            actual = file_sha256(path)
            if actual != digest:
                problems.append((name, f"changed: sha256 {actual}, SHA256SUMS lists {digest}"))
    for name in sorted(os.listdir(folder)):
        if name not in listed and name not in (SUMS, SIGNATURE):
            problems.append((name, "extra: not listed in SHA256SUMS"))
    return problems


# ---------------------------------------------------------------- writing

def write_pack(folder: str, record: dict, *, signing_key: str = "", gnupg_home: str = "",
               report_sha256: str | None = None) -> dict:
    """Write the pack whole (a new directory swapped in for the old one) and sign it when a key is named.
    The record is bound to where it is written (``binding``) and, given ``report_sha256``, to its report.

    Returns {dir, signed, sha256 (of evidence.json), error}: a key that cannot sign leaves the pack unsigned
    and says why (``error``); the record then says so too."""
    record = {**record, "format": FORMAT, "binding": binding(folder, report_sha256)}
    if signing_key and not gnupg_home:
        raise EvidenceError("atlas_evidence_signing_key is set without atlas_evidence_gnupg_home: name the gpg "
                            "home directory that holds the key's secret part")
    parent, name = os.path.split(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp, mode=0o755)
    error = ""
    try:
        data = (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()
        with open(os.path.join(tmp, RECORD), "wb") as handle:
            handle.write(data)
        with open(os.path.join(tmp, SUMS), "w", encoding="utf-8") as handle:
            handle.write(sums_text({RECORD: data}))
        if signing_key:
            try:
                signature.sign_detached(os.path.join(tmp, SUMS), os.path.join(tmp, SIGNATURE), signing_key,
                                        gnupg_home)
            except signature.SignatureError as exc:
                error = str(exc)
        if error:  # the record must not claim a signature the pack lacks
            record = {**record, "signature": {**record.get("signature", {}), "signed": False,
                                              "note": f"UNSIGNED: signing failed: {error}"}}
            data = (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()
            with open(os.path.join(tmp, RECORD), "wb") as handle:
                handle.write(data)
            with open(os.path.join(tmp, SUMS), "w", encoding="utf-8") as handle:
                handle.write(sums_text({RECORD: data}))
        old = os.path.join(parent, f".{name}.old-{os.getpid()}")
        if os.path.isdir(folder):
            os.rename(folder, old)
        os.rename(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"dir": os.path.abspath(folder), "signed": bool(signing_key) and not error,
            "sha256": hashlib.sha256(data).hexdigest(), "status": record.get("status"), "error": error}


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def json_depth(text: str) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets inside strings do not count)."""
    depth = deepest = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


class TooDeep(EvidenceError):
    """A JSON text nested deeper than MAX_DEPTH: refused before it is parsed."""


def loads_bounded(text: str, where: str, max_depth: int = MAX_DEPTH):
    """json.loads, refusing a text nested deeper than ``max_depth`` (TooDeep) instead of recursing into a
    RecursionError; any other JSON that does not parse is an EvidenceError naming ``where``."""
    if json_depth(text) > max_depth:
        raise TooDeep(f"{where}: nested deeper than {max_depth} levels: refused (an evidence record nests a few)")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise EvidenceError(f"{where}: not a JSON record ({exc})") from None


def read_record(folder: str) -> dict:
    """evidence.json of a pack, format 1 (unbound) or 2 (not checked: see check_files and the signature)."""
    where = os.path.join(folder, RECORD)
    try:
        with open(where, "rb") as handle:
            text = handle.read().decode("utf-8")
    except FileNotFoundError:
        raise EvidenceError(f"{where}: missing") from None
    except UnicodeDecodeError as exc:
        raise EvidenceError(f"{where}: not a JSON record ({exc})") from None
    except OSError as exc:
        raise EvidenceError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    record = loads_bounded(text, where)
    if not isinstance(record, dict) or record.get("format") not in FORMATS:
        raise EvidenceError(f"{where}: not an evidence record (format {FORMAT!r} or {FORMAT_V1!r})")
    return record

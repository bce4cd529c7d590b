"""Rollout evidence packs (docs/evidence.md): verify one, render one, and finish one the playbook could not.

A pack's format and its writing are the collection's (module_utils/evidence.py: the playbook's module
``atlas.serving.rollout_evidence`` writes it); the signature is checked by the bundle's verifier
(module_utils/signature.py: gpg with a throwaway homedir, a keyring file, a pinned full fingerprint).

A pack is bound to its rollout (format 2): ``verify`` checks the rollout its record names against the folder
the pack sits in (``<inventory_key>/<rollout>.evidence``) or against ``--rollout``, the report beside it
against the sha256 the record names, and refuses a pack that is a symbolic link or holds a link (symbolic or
hard): its files must be its own. A format-1 pack is "unbound, older format", accepted only when allowed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ansible_collections.atlas.serving.plugins.module_utils import evidence as mu
from ansible_collections.atlas.serving.plugins.module_utils import signature as sig
from ansible_collections.atlas.serving.plugins.module_utils.checksums import file_sha256

from atlasctl import inventory as shared
from atlasctl.errors import EnvironmentProblem, UsageError
from atlasctl.outputs import safe, safe_row

SIGNING_KEY_VAR = "atlas_evidence_signing_key"
GNUPG_HOME_VAR = "atlas_evidence_gnupg_home"
KEY_FIX = (f"pass --keyring FILE --fingerprint FPR (the controller's evidence key, exported with gpg --export), "
           f"or -i INVENTORY naming {SIGNING_KEY_VAR} and {GNUPG_HOME_VAR}")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What ``verify`` found: ``problems`` as (file, what is wrong), one per file."""

    folder: Path
    files: int
    problems: list[tuple[str, str]]
    signed_by: str = ""  # the primary key of a good signature by the pinned key
    unsigned: bool = False  # the pack carries no signature (accepted only with --allow-unsigned)
    signature_checked: bool = False
    rollout: str = ""  # the rollout the record is bound to ("" for an unbound, older pack)
    unbound: bool = False  # a format-1 pack: it names no rollout (accepted only with --allow-unbound)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"dir": str(self.folder), "ok": self.ok, "files": self.files, "signed_by": self.signed_by or None,
                "unsigned": self.unsigned, "signature_checked": self.signature_checked,
                "rollout": self.rollout or None, "unbound": self.unbound,
                "problems": [{"file": f, "problem": p} for f, p in self.problems]}


def _is_pack(folder: Path) -> None:
    if not folder.is_dir():
        raise UsageError(f"evidence pack {folder}: not a directory",
                         fix="pass the .evidence directory beside a rollout's report (artifacts/rollouts/...)")
    if not any((folder / name).exists() for name in (mu.RECORD, mu.SUMS, mu.SIGNATURE)):
        raise UsageError(f"evidence pack {folder}: none of {mu.RECORD}, {mu.SUMS}, {mu.SIGNATURE} is there: "
                         "not an evidence pack",
                         fix="pass the .evidence directory beside a rollout's report (artifacts/rollouts/...)")


# ---------------------------------------------------------------- links: a pack's files are its own

LINK_FIX = "copy the pack with cp -r (not cp -l, ln -s or a hard-linking backup) and check the copy"


def _link_problem(path: Path) -> str:
    try:
        info = path.lstat()
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISLNK(info.st_mode):
        return f"a symbolic link (to {safe(os.readlink(path))}): refused, a pack's files are its own"
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        return f"hard-linked ({info.st_nlink} names for one file): refused, a pack's files are its own"
    return ""


def link_problems(folder: Path) -> list[tuple[str, str]]:
    """(file, problem) for the pack directory itself as a symbolic link ("" names the directory), or for
    every entry of it that is a symbolic link or a file with more than one name (st_nlink > 1)."""
    if folder.is_symlink():
        return [("", f"the pack directory is a symbolic link (to {safe(os.readlink(folder))}): refused")]
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        return [("", f"cannot list it ({exc.strerror or exc})")]
    return [(name, problem) for name in names if (problem := _link_problem(folder / name))]


# ---------------------------------------------------------------- binding: the pack and its rollout

def parse_rollout(text: str) -> tuple[str, str]:
    """(rollout, folder of the inventory's rollouts or "") from ``--rollout``: ``<rollout>`` or
    ``<inventory folder>/<rollout>`` (the names under artifacts/rollouts)."""
    where, _, rollout = text.strip().removesuffix(mu.SUFFIX).rpartition("/")
    if not rollout or "/" in where or rollout in (".", "..") or where in (".", ".."):
        raise UsageError(f"--rollout {text!r} is not a rollout id",
                         fix="pass <start>-<release> or <inventory>-<hash>/<start>-<release> (the pack's and its "
                             "folder's names under artifacts/rollouts)")
    return rollout, where


def _report_problem(folder: Path, bound: dict) -> list[tuple[str, str]]:
    """The report beside the pack (``<rollout>.json``) against the sha256 the record binds; none there: nothing
    to check (the pack stands alone)."""
    report = folder.parent / (mu.rollout_of(str(folder))[0] + ".json")
    if not report.is_file():
        return []
    if not bound.get("report_sha256"):
        return [(mu.RECORD, f"the report beside it, {report.name}, is not bound to it: the record names no report "
                            "sha256 (an earlier pack of the run, or one laid beside another run's report)")]
    actual = file_sha256(report)
    if actual != bound["report_sha256"]:
        return [(mu.RECORD, f"the report beside it, {report.name}, is not the one it is bound to: sha256 {actual}, "
                            f"the record binds {bound['report_sha256']}")]
    return []


def binding_problems(folder: Path, record: dict, rollout: str = "") -> list[tuple[str, str]]:
    """The record's binding against ``--rollout`` (``rollout``), else against where the pack sits, and the
    report beside it against the sha256 it binds."""
    bound = record.get("binding")
    if not isinstance(bound, dict) or not all(isinstance(bound.get(k), str) for k in ("rollout", "rollouts_folder")):
        return [(mu.RECORD, "its binding (the rollout it belongs to) is missing or not readable")]
    expected, where = parse_rollout(rollout) if rollout else mu.rollout_of(str(folder))
    what = f"--rollout {rollout}" if rollout else "the folder it sits in"
    problems = []
    if bound["rollout"] != expected:
        problems.append((mu.RECORD, f"bound to rollout {safe(bound['rollout'])!r}, not {safe(expected)!r} "
                                    f"({what}): a pack of another rollout"))
    elif where and bound["rollouts_folder"] != where:
        problems.append((mu.RECORD, f"bound to rollout {safe(bound['rollout'])!r} of the rollouts folder "
                                    f"{safe(bound['rollouts_folder'])!r}, not {safe(where)!r} ({what}): a pack of "
                                    "another inventory's rollout"))
    return problems + _report_problem(folder, bound)


def is_unbound(record: dict) -> bool:
    """A format-1 record: it names no rollout (written before packs were bound)."""
    return record.get("format") == mu.FORMAT_V1


UNBOUND = ("unbound, older format ({}): it names no rollout and no report, so nothing ties it to this folder; "
           "accepted only with --allow-unbound")


def _record_problems(folder: Path, rollout: str, allow_unbound: bool) -> tuple[list[tuple[str, str]], dict]:
    """(problems, record) of the record's binding; a record nested too deep is bad input (UsageError)."""
    try:
        record = mu.read_record(str(folder))
    except mu.TooDeep as exc:
        raise UsageError(str(exc), fix="this is not a pack atlasctl or the playbook wrote: do not trust it") from None
    except mu.EvidenceError as exc:
        return [(mu.RECORD, str(exc).rpartition(f"{mu.RECORD}: ")[2])], {}
    if is_unbound(record):
        return ([] if allow_unbound else [(mu.RECORD, UNBOUND.format(mu.FORMAT_V1))]), record
    return binding_problems(folder, record, rollout), record


def _claimed_signer_problem(record: dict, signed_by: str, signer: str) -> list[tuple[str, str]]:
    """The key the record names as its signer (what ``show`` prints) against the key that signed it."""
    claimed = str((record.get("signature") or {}).get("key") or "").replace(" ", "").upper()
    if not claimed or claimed in (signed_by.upper(), signer.upper()):
        return []
    return [(mu.RECORD, f"names {safe(claimed)} as its signer, but {signed_by} signed it")]


# ---------------------------------------------------------------- which key

def key_from_inventory(inventory: Path) -> tuple[str, str]:
    """(fingerprint, gnupg home) the inventory names for its evidence packs (its serving hosts agree)."""
    data = shared.listing(inventory)
    hostvars = shared.hostvars(data)
    names = sorted(shared.group_hosts(data, shared.SERVING_GROUP)) or sorted(hostvars)
    found = {(str((hostvars.get(n) or {}).get(SIGNING_KEY_VAR) or ""),
              str((hostvars.get(n) or {}).get(GNUPG_HOME_VAR) or "")) for n in names}
    if len(found) > 1:
        raise UsageError(f"inventory {inventory}: the hosts disagree on {SIGNING_KEY_VAR}/{GNUPG_HOME_VAR}",
                         fix="set them once, in group_vars/all")
    fingerprint, home = found.pop() if found else ("", "")
    if not fingerprint:
        raise UsageError(f"inventory {inventory} names no {SIGNING_KEY_VAR}", fix=KEY_FIX)
    if not home or "{{" in home or not Path(home).is_dir():
        raise UsageError(f"inventory {inventory}: {GNUPG_HOME_VAR} {home or '(not set)'} is not a directory here",
                         fix=KEY_FIX)
    return fingerprint, home


def export_keyring(home: str, fingerprint: str, dest: Path) -> Path:
    """The public key ``fingerprint`` from the gpg home ``home`` into the keyring file ``dest``."""
    try:
        argv = [*sig.isolated_gpg(home), "--export", fingerprint]
    except sig.SignatureError as exc:
        raise EnvironmentProblem(str(exc), fix="apt-get install gnupg gpgv") from None
    proc = subprocess.run(argv, capture_output=True, check=False, timeout=60)
    if proc.returncode != 0 or not proc.stdout:
        raise UsageError(f"gpg home {home} holds no public key {fingerprint}",
                         fix=f"check {SIGNING_KEY_VAR} and {GNUPG_HOME_VAR} (gpg --homedir {home} --list-keys)")
    dest.write_bytes(proc.stdout)
    return dest


# ---------------------------------------------------------------- verify

def _signature_problem(exc: Exception, fingerprint: str, keyring: str) -> str:
    reason = getattr(exc, "reason", "")
    text = str(exc)
    key = (re.findall(r"\b[0-9A-F]{40}\b", text) or re.findall(r"key ([0-9A-F]{16})", text) or ["?"])[0]
    return {
        "bad": "BAD signature: SHA256SUMS was changed after it was signed, or the signature was replaced",
        "untrusted": f"a foreign signature: good, but by key {key}, not the pinned {fingerprint}",
        "unknown-key": f"a foreign signature: by key {key}, which is not in the keyring {keyring}",
        "revoked": "signed by a REVOKED key",
        "expired-key": "signed by an EXPIRED key",
        "expired-signature": "the signature has EXPIRED",
    }.get(reason, f"refused ({reason or 'gpg'}): {text[:300]}")


def verify(folder: Path, *, keyring: Path | None = None, fingerprint: str = "", allow_unsigned: bool = False,
           rollout: str = "", allow_unbound: bool = False) -> Verdict:
    """Check a pack: it is no link and holds none, every file SHA256SUMS lists is there and matches, nothing
    else is there, its record is bound to this rollout (``rollout``, else the folder it sits in) and to the
    report beside it, and SHA256SUMS.asc is a good signature by the pinned key, the key the record names.
    Bad input (no such pack, no key to check a signed pack against, a keyring that is not a file, a short
    fingerprint, a record nested too deep to read) is a UsageError."""
    folder = Path(folder)
    if rollout:
        parse_rollout(rollout)
    if folder.is_symlink():
        return Verdict(folder, 0, link_problems(folder))
    _is_pack(folder)
    if bool(keyring) != bool(fingerprint):
        raise UsageError("--keyring and --fingerprint go together", fix=KEY_FIX)
    pinned: list[str] = []
    if fingerprint:
        try:
            pinned = sig.normalize_fingerprints([fingerprint], "--fingerprint")
        except sig.SignatureError as exc:
            raise UsageError(str(exc), fix=KEY_FIX) from None
        if not Path(keyring).is_file():
            raise UsageError(f"--keyring {keyring}: no such file", fix=KEY_FIX)
    links = link_problems(folder)
    if links:
        return Verdict(folder, _listed(folder), links)
    try:
        problems = mu.check_files(str(folder))
    except mu.EvidenceError as exc:
        problems = [(mu.SUMS, str(exc).removeprefix(f"{mu.SUMS}: "))]
    if not any(name == mu.RECORD for name, _ in problems):
        found, record = _record_problems(folder, rollout, allow_unbound)
        problems += found
    else:
        record = {}
    bound = dict(rollout=str((record.get("binding") or {}).get("rollout") or ""), unbound=is_unbound(record))
    listed = _listed(folder)
    sums, asc = folder / mu.SUMS, folder / mu.SIGNATURE
    if not asc.is_file():
        if not allow_unsigned:
            problems.append((mu.SIGNATURE, "missing: the pack is NOT signed (an unsigned pack is accepted only "
                                           "with --allow-unsigned)"))
        return Verdict(folder, listed, problems, unsigned=True, **bound)
    if not pinned:
        if allow_unsigned:
            return Verdict(folder, listed, problems, **bound)
        raise UsageError(f"evidence pack {folder} is signed: name the key to check it against", fix=KEY_FIX)
    if not sums.is_file():
        return Verdict(folder, listed, problems, **bound)
    try:
        verdict = sig.verify_manifest(sums.read_bytes(), asc.read_bytes(), keyring=str(keyring), fingerprints=pinned,
                                      manifest_name=mu.SUMS, signature_name=mu.SIGNATURE)
    except sig.SignatureError as exc:
        if exc.reason == "environment":
            raise EnvironmentProblem(str(exc), fix="apt-get install gnupg gpgv") from None
        if exc.reason == "config":
            raise UsageError(str(exc), fix=KEY_FIX) from None
        problems.append((mu.SIGNATURE, _signature_problem(exc, pinned[0], str(keyring))))
        return Verdict(folder, listed, problems, signature_checked=True, **bound)
    problems += _claimed_signer_problem(record, verdict.primary_fingerprint, verdict.fingerprint)
    return Verdict(folder, listed, problems, signed_by=verdict.primary_fingerprint, signature_checked=True, **bound)


def _listed(folder: Path) -> int:
    try:
        return len(mu.parse_sums((folder / mu.SUMS).read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, mu.EvidenceError):
        return 0


def verify_with_inventory(folder: Path, inventory: Path, allow_unsigned: bool = False, **binding: Any) -> Verdict:
    """verify() against the key the inventory names (its public part exported from its gpg home)."""
    fingerprint, home = key_from_inventory(inventory)
    if not Path(folder).is_symlink():
        _is_pack(Path(folder))
    with tempfile.TemporaryDirectory(prefix="atlas-evidence-") as tmp:
        keyring = export_keyring(home, fingerprint, Path(tmp) / "evidence.gpg")
        return verify(folder, keyring=keyring, fingerprint=fingerprint, allow_unsigned=allow_unsigned, **binding)


# ---------------------------------------------------------------- read and render

def read(folder: Path) -> dict[str, Any]:
    """The pack's record (evidence.json), as written; not verified."""
    folder = Path(folder)
    _is_pack(folder)
    try:
        record = mu.read_record(str(folder))
    except mu.EvidenceError as exc:
        raise UsageError(str(exc), fix="run atlasctl evidence verify on it") from None
    problem = shape_problem(record)
    if problem:
        raise UsageError(f"{folder / mu.RECORD}: not the shape of an evidence record: {problem}",
                         fix="run atlasctl evidence verify on it")
    return record


def _objects(value: object) -> bool:
    return value is None or (isinstance(value, list) and all(isinstance(v, dict) for v in value))


def shape_problem(record: dict) -> str:
    """What in a record is not the shape ``render_text`` reads ("" when none): objects and lists of objects."""
    for key in ("controller", "bundle", "signature", "failure", "binding"):
        if record.get(key) is not None and not isinstance(record[key], dict):
            return f"{key} is not an object"
    for key in ("nodes", "plan", "rollbacks"):
        if not _objects(record.get(key)):
            return f"{key} is not a list of objects"
    for wave in record.get("plan") or []:
        if not isinstance(wave.get("hosts") or [], list):
            return "a wave's hosts are not a list"
    for node in record.get("nodes") or []:
        if not _objects(node.get("gates")) or not isinstance(node.get("versions") or {}, dict) \
                or not isinstance(node.get("files_sha256") or {}, dict):
            return "a node's gates, versions or files_sha256 are not what a rollout writes"
    return ""


def _table_lines(rows: list[dict], columns: list[tuple[str, str]]) -> list[str]:
    # here, not at start-up: the filter imports Ansible
    from ansible_collections.atlas.serving.plugins.filter.serving import table_lines

    return table_lines(rows, columns)


NODE_COLUMNS = [("host", "HOST"), ("wave", "WAVE"), ("result", "RESULT"), ("change", "FROM -> TO"),
                ("engine", "ENGINE"), ("model", "MODEL VERSION"), ("driver", "DRIVER"), ("firmware", "FIRMWARE"),
                ("cann", "CANN"), ("at", "AT")]


def _short(value: object, width: int = 16) -> str:
    text = "-" if value in (None, "", [], {}) else str(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def figures_text(figures: dict | None) -> str:
    """A gate's figures in one line (the health probe's, the SLO load's metrics and violations)."""
    if not figures or not isinstance(figures, dict):
        return ""
    parts = []
    for key, value in figures.items():
        if key == "metrics" and isinstance(value, dict):
            parts += [f"{k} {json.dumps(v, sort_keys=True)[:80]}" for k, v in sorted(value.items())]
        elif key == "prometheus" and isinstance(value, dict):
            parts.append(f"prometheus {value.get('window', '')}")
        else:
            parts.append(f"{key} {json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value}")
    return ", ".join(parts)


def node_rows(record: dict) -> list[dict]:
    rows = []
    for node in record.get("nodes") or []:
        v = node.get("versions") or {}
        engine = " ".join(str(x) for x in (v.get("engine_release") or v.get("engine"), v.get("image_id")) if x)
        rows.append({"host": node.get("host"), "wave": node.get("wave") or "-", "result": node.get("result"),
                     "change": f"{node.get('previous') or '-'} -> {node.get('release') or '-'}",
                     "engine": _short(engine, 28), "model": _short(v.get("model_version")),
                     "driver": _short(v.get("driver")), "firmware": _short(v.get("firmware")),
                     "cann": _short(v.get("cann")), "at": node.get("at") or "-"})
    return [safe_row(row) for row in rows]


def _signature_line(record: dict) -> str:
    signature = record.get("signature") or {}
    if signature.get("signed"):
        return f"signed by the controller's key {signature.get('key')} (check it: atlasctl evidence verify)"
    return f"!!! {signature.get('note') or 'UNSIGNED'}"


def _binding_line(record: dict) -> str:
    if is_unbound(record):
        return f"!!! UNBOUND, older format ({mu.FORMAT_V1}): it names no rollout"
    bound = record.get("binding") or {}
    report = f"report {bound.get('report')} sha256 {bound['report_sha256']}" if bound.get("report_sha256") \
        else "no report bound"
    return f"{bound.get('rollouts_folder')}/{bound.get('rollout')}, {report}"


def show_warnings(folder: Path, record: dict, pinned: str = "") -> list[str]:
    """What ``show`` warns of: links in the pack, an unbound record, and a signer that is not the pinned key
    (or no pinned key to hold it to)."""
    warnings = [f"{safe(folder / name)}: {problem}" for name, problem in link_problems(folder)]
    if is_unbound(record):
        warnings.append(UNBOUND.format(mu.FORMAT_V1).partition("; accepted")[0])
    signature = record.get("signature") or {}
    claimed = str(signature.get("key") or "").replace(" ", "").upper()
    if not signature.get("signed"):
        return warnings
    if not pinned:
        warnings.append(f"the signer {safe(claimed)} is NOT checked: no pinned key named (pass --fingerprint, or "
                        "-i INVENTORY; atlasctl evidence verify checks the signature itself)")
    elif claimed != pinned.upper():
        warnings.append(f"signed by {safe(claimed)}, NOT the pinned key {pinned}: do not trust this pack "
                        "(atlasctl evidence verify refuses it)")
    return warnings


def render_text(record: dict) -> str:
    bundle = record.get("bundle") or {}
    plan = " | ".join(f"{w.get('name')}: {', '.join(str(h) for h in w.get('hosts') or [])}"
                      f"{' (skipped)' if w.get('skipped') else ''}" for w in record.get("plan") or [])
    who = record.get("controller") or {}
    user = who.get("user") or "?"
    if who.get("sudo_user"):
        user += f" (sudo by {who['sudo_user']})"
    lines = [
        f"rollout {record.get('release')}: {str(record.get('status')).upper()}"
        f"{'' if record.get('complete') else ' (NOT complete: the run ended before its last record)'}",
        f"  inventory   {record.get('inventory') or '-'}",
        f"  controller  {who.get('hostname') or '?'}, user {user}",
        f"  started     {record.get('started_at') or '-'}, ended {record.get('ended_at') or '-'}"
        f"{', resumed from ' + str(record['resumed_from']) if record.get('resumed_from') else ''}",
        f"  bundle      manifest.json sha256 {bundle.get('manifest_sha256') or '-'}, "
        f"signed by {bundle.get('signed_by') or '-'}",
        f"  pack        {_signature_line(record)}",
        f"  rollout     {_binding_line(record)}",
        f"  plan        {plan or '-'}",
    ]
    lines = [safe(line) for line in lines] + ["", *_table_lines(node_rows(record), NODE_COLUMNS)]
    gates = []
    for node in record.get("nodes") or []:
        for gate in node.get("gates") or []:
            text = f"{node.get('host')!s:<12} {gate.get('gate')!s:<9} {gate.get('result')}"
            extra = str(gate.get("why") or figures_text(gate.get("figures")))
            gates.append(f"{text}{': ' + extra[:240] if extra else ''}")
    if gates:
        lines += ["", "gates:", *(f"  {safe(g)}" for g in gates)]
    files = [safe(f"  {n.get('host')!s:<12} {name:<22} {digest or 'missing'}") for n in record.get("nodes") or []
             for name, digest in sorted((n.get("files_sha256") or {}).items())]
    if files:
        lines += ["", "rendered files (sha256):", *files]
    rollbacks = [safe(f"  {r.get('host')} (wave {r.get('wave')}): gate {r.get('gate')}: {str(r.get('why', ''))[:300]}"
                      f" -> running {r.get('running_after') or '?'}") for r in record.get("rollbacks") or []]
    if rollbacks:
        lines += ["", "rollbacks:", *rollbacks]
    notes = [safe(f"  {n.get('host')}: {n['note']}") for n in record.get("nodes") or [] if n.get("note")]
    if record.get("failure"):
        failure = record["failure"]
        notes.append(safe(f"  failure: {failure.get('host')}, gate {failure.get('gate')}: "
                          f"{str(failure.get('why'))[:300]}"))
    if notes:
        lines += ["", "notes:", *notes]
    return "\n".join(lines)


def render_html(record: dict, folder: Path | None = None, warnings: list[str] | None = None) -> str:
    """One self-contained page (inline CSS, no script) an auditor reads without the suite; its text escaped
    (HTML, and control characters made visible: bench.report._env), ``warnings`` before the pack's signer."""
    import jinja2

    from atlasctl.bench.report import _env

    try:
        return _env().get_template("evidence_report.html.j2").render(
            record=record, folder=str(folder or ""), nodes=node_rows(record), columns=NODE_COLUMNS,
            signature=" | ".join([*(warnings or []), _signature_line(record)]), figures_text=figures_text)
    except jinja2.TemplateError as exc:
        raise UsageError(f"{folder or 'the record'}: cannot render it as a page ({exc})",
                         fix="run atlasctl evidence verify on it") from None


# ---------------------------------------------------------------- finishing a pack

def complete(folder: Path, report: dict[str, Any], report_path: Path | None = None) -> dict[str, Any]:
    """After ``atlasctl rollout``: the pack's summary for the report (``report["evidence"]``). When the playbook
    ended before its last evidence write (a node lost alone in its batch, every node refusing the bundle, an
    interrupt), the pack is finished here from the run's report. Given ``report_path``, the report (with the
    summary) is written there and the pack is signed again, bound to the report's sha256."""
    folder = Path(folder)
    if not (folder / mu.RECORD).is_file():
        summary = {"dir": None, "signed": False,
                   "note": "no evidence pack: the playbook ended before its plan play wrote one"}
        return _write_report(report_path, report, summary)
    try:
        return _complete(folder, report, report_path)
    except (mu.EvidenceError, OSError) as exc:  # the report is written all the same, naming the problem
        summary = {"dir": str(folder), "signed": False, "note": f"the evidence pack could not be finished: {exc}"}
        return _write_report(report_path, report, summary)


def report_bytes(report: dict[str, Any]) -> bytes:
    """The report as ``atlasctl rollout`` writes it (the bytes the pack binds by their sha256)."""
    return (json.dumps(report, indent=1, sort_keys=True) + "\n").encode()


def _write_report(path: Path | None, report: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    if path is not None:
        Path(path).write_bytes(report_bytes({**report, "evidence": summary}))
    return summary


def _finished_record(record: dict, report: dict[str, Any]) -> dict:
    """The record as the run's last: as it is when the playbook wrote it complete, else finished from the
    report. Only what the playbook could not record: a host lost alone in its batch, the run stopped outside
    the waves. A gate's failure is in the record already, its messages cleared of secrets by the playbook."""
    if record.get("complete"):
        return record
    failure = report.get("failure") or {}
    failure = {k: failure.get(k) for k in ("host", "wave", "gate", "task", "why")} \
        if failure.get("gate") in ("unreachable", "playbook") else None
    entries = []
    for node in record.get("nodes") or []:
        if failure and node.get("host") == failure.get("host") and node.get("result") not in ("failed", "ok"):
            node = {**node, "result": "lost", "note": f"{failure.get('gate')}: {str(failure.get('why'))[:500]}"}
        entries.append(node)
    signature = record.get("signature") or {}
    inputs = {**{k: record.get(k) for k in ("release", "inventory", "plan", "resumed_from", "started_at")},
              "complete": True, "nodes": entries, "failure": failure}
    return mu.build_record(inputs, signing_key=signature.get("key") or "", gnupg_home=signature.get("gnupg_home") or "")


def _complete(folder: Path, report: dict[str, Any], report_path: Path | None) -> dict[str, Any]:
    record = mu.read_record(str(folder))
    finished = _finished_record(record, report)
    signature = finished.get("signature") or {}
    key, home = signature.get("key") or "", signature.get("gnupg_home") or ""
    if finished is record and report_path is None:
        return _summary(folder, record)
    summary = {"dir": str(folder), "signed": bool(key), "status": finished.get("status"), "key": key or None}
    digest = hashlib.sha256(report_bytes({**report, "evidence": summary})).hexdigest() if report_path else None
    written = mu.write_pack(str(folder), finished, signing_key=key, gnupg_home=home, report_sha256=digest)
    if written["error"] and report_path is not None:  # unsigned after all: the report says so, the pack binds it
        summary = {**summary, "signed": False, "note": f"UNSIGNED: signing failed: {written['error']}"}
        digest = hashlib.sha256(report_bytes({**report, "evidence": summary})).hexdigest()
        mu.write_pack(str(folder), mu.read_record(str(folder)), report_sha256=digest)
    return _write_report(report_path, report, summary) if report_path else _summary(folder, mu.read_record(str(folder)))


def _summary(folder: Path, record: dict) -> dict[str, Any]:
    return {"dir": str(folder), "signed": (folder / mu.SIGNATURE).is_file(), "status": record.get("status"),
            "key": (record.get("signature") or {}).get("key")}

"""Rollout evidence packs (docs/evidence.md): verify one, render one, and finish one the playbook could not.

A pack's format and its writing are the collection's (module_utils/evidence.py: the playbook's module
``atlas.serving.rollout_evidence`` writes it); the signature is checked by the bundle's verifier
(module_utils/signature.py: gpg with a throwaway homedir, a keyring file, a pinned full fingerprint).
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ansible_collections.atlas.serving.plugins.module_utils import evidence as mu
from ansible_collections.atlas.serving.plugins.module_utils import signature as sig

from atlasctl import inventory as shared
from atlasctl.errors import EnvironmentProblem, UsageError

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

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"dir": str(self.folder), "ok": self.ok, "files": self.files, "signed_by": self.signed_by or None,
                "unsigned": self.unsigned, "signature_checked": self.signature_checked,
                "problems": [{"file": f, "problem": p} for f, p in self.problems]}


def _is_pack(folder: Path) -> None:
    if not folder.is_dir():
        raise UsageError(f"evidence pack {folder}: not a directory",
                         fix="pass the .evidence directory beside a rollout's report (artifacts/rollouts/...)")
    if not any((folder / name).exists() for name in (mu.RECORD, mu.SUMS, mu.SIGNATURE)):
        raise UsageError(f"evidence pack {folder}: none of {mu.RECORD}, {mu.SUMS}, {mu.SIGNATURE} is there: "
                         "not an evidence pack",
                         fix="pass the .evidence directory beside a rollout's report (artifacts/rollouts/...)")


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


def verify(folder: Path, *, keyring: Path | None = None, fingerprint: str = "",
           allow_unsigned: bool = False) -> Verdict:
    """Check a pack: every file SHA256SUMS lists is there and matches, nothing else is there, and
    SHA256SUMS.asc is a good signature by the pinned key. Bad input (no such pack, no key to check a
    signed pack against, a keyring that is not a file, a short fingerprint) is a UsageError."""
    folder = Path(folder)
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
    try:
        problems = mu.check_files(str(folder))
    except mu.EvidenceError as exc:
        problems = [(mu.SUMS, str(exc).removeprefix(f"{mu.SUMS}: "))]
    listed = _listed(folder)
    sums, asc = folder / mu.SUMS, folder / mu.SIGNATURE
    if not asc.is_file():
        if not allow_unsigned:
            problems.append((mu.SIGNATURE, "missing: the pack is NOT signed (an unsigned pack is accepted only "
                                           "with --allow-unsigned)"))
        return Verdict(folder, listed, problems, unsigned=True)
    if not pinned:
        if allow_unsigned:
            return Verdict(folder, listed, problems)
        raise UsageError(f"evidence pack {folder} is signed: name the key to check it against", fix=KEY_FIX)
    if not sums.is_file():
        return Verdict(folder, listed, problems)
    try:
        verdict = sig.verify_manifest(sums.read_bytes(), asc.read_bytes(), keyring=str(keyring), fingerprints=pinned,
                                      manifest_name=mu.SUMS, signature_name=mu.SIGNATURE)
    except sig.SignatureError as exc:
        if exc.reason == "environment":
            raise EnvironmentProblem(str(exc), fix="apt-get install gnupg gpgv") from None
        if exc.reason == "config":
            raise UsageError(str(exc), fix=KEY_FIX) from None
        problems.append((mu.SIGNATURE, _signature_problem(exc, pinned[0], str(keyring))))
        return Verdict(folder, listed, problems, signature_checked=True)
    return Verdict(folder, listed, problems, signed_by=verdict.primary_fingerprint, signature_checked=True)


def _listed(folder: Path) -> int:
    try:
        return len(mu.parse_sums((folder / mu.SUMS).read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, mu.EvidenceError):
        return 0


def verify_with_inventory(folder: Path, inventory: Path, allow_unsigned: bool = False) -> Verdict:
    """verify() against the key the inventory names (its public part exported from its gpg home)."""
    fingerprint, home = key_from_inventory(inventory)
    _is_pack(Path(folder))
    with tempfile.TemporaryDirectory(prefix="atlas-evidence-") as tmp:
        keyring = export_keyring(home, fingerprint, Path(tmp) / "evidence.gpg")
        return verify(folder, keyring=keyring, fingerprint=fingerprint, allow_unsigned=allow_unsigned)


# ---------------------------------------------------------------- read and render

def read(folder: Path) -> dict[str, Any]:
    """The pack's record (evidence.json), as written; not verified."""
    folder = Path(folder)
    _is_pack(folder)
    try:
        return mu.read_record(str(folder))
    except mu.EvidenceError as exc:
        raise UsageError(str(exc), fix="run atlasctl evidence verify on it") from None


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
    if not figures:
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
    return rows


def _signature_line(record: dict) -> str:
    signature = record.get("signature") or {}
    if signature.get("signed"):
        return f"signed by the controller's key {signature.get('key')} (check it: atlasctl evidence verify)"
    return f"!!! {signature.get('note') or 'UNSIGNED'}"


def render_text(record: dict) -> str:
    bundle = record.get("bundle") or {}
    plan = " | ".join(f"{w.get('name')}: {', '.join(w.get('hosts') or [])}{' (skipped)' if w.get('skipped') else ''}"
                      for w in record.get("plan") or [])
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
        f"{', resumed from ' + record['resumed_from'] if record.get('resumed_from') else ''}",
        f"  bundle      manifest.json sha256 {bundle.get('manifest_sha256') or '-'}, "
        f"signed by {bundle.get('signed_by') or '-'}",
        f"  pack        {_signature_line(record)}",
        f"  plan        {plan or '-'}",
        "",
        *_table_lines(node_rows(record), NODE_COLUMNS),
    ]
    gates = []
    for node in record.get("nodes") or []:
        for gate in node.get("gates") or []:
            text = f"{node['host']:<12} {gate['gate']:<9} {gate['result']}"
            extra = gate.get("why") or figures_text(gate.get("figures"))
            gates.append(f"{text}{': ' + extra[:240] if extra else ''}")
    if gates:
        lines += ["", "gates:", *(f"  {g}" for g in gates)]
    files = [f"  {n['host']:<12} {name:<22} {digest or 'missing'}" for n in record.get("nodes") or []
             for name, digest in sorted((n.get("files_sha256") or {}).items())]
    if files:
        lines += ["", "rendered files (sha256):", *files]
    rollbacks = [f"  {r['host']} (wave {r.get('wave')}): gate {r.get('gate')}: {str(r.get('why', ''))[:300]}"
                 f" -> running {r.get('running_after') or '?'}" for r in record.get("rollbacks") or []]
    if rollbacks:
        lines += ["", "rollbacks:", *rollbacks]
    notes = [f"  {n['host']}: {n['note']}" for n in record.get("nodes") or [] if n.get("note")]
    if record.get("failure"):
        failure = record["failure"]
        notes.append(f"  failure: {failure.get('host')}, gate {failure.get('gate')}: {str(failure.get('why'))[:300]}")
    if notes:
        lines += ["", "notes:", *notes]
    return "\n".join(lines)


def render_html(record: dict, folder: Path | None = None) -> str:
    """One self-contained page (inline CSS, no script) an auditor reads without the suite."""
    from atlasctl.bench.report import _env

    return _env().get_template("evidence_report.html.j2").render(
        record=record, folder=str(folder or ""), nodes=node_rows(record), columns=NODE_COLUMNS,
        signature=_signature_line(record), figures_text=figures_text)


# ---------------------------------------------------------------- finishing a pack

def complete(folder: Path, report: dict[str, Any]) -> dict[str, Any]:
    """After ``atlasctl rollout``: the pack's summary for the report. When the playbook ended before its
    last evidence write (a node lost alone in its batch, every node refusing the bundle, an interrupt),
    the pack is finished here from the run's report and signed again with the key its record names."""
    folder = Path(folder)
    if not (folder / mu.RECORD).is_file():
        return {"dir": None, "signed": False,
                "note": "no evidence pack: the playbook ended before its plan play wrote one"}
    try:
        return _complete(folder, report)
    except (mu.EvidenceError, OSError) as exc:  # the report is written all the same, naming the problem
        return {"dir": str(folder), "signed": False, "note": f"the evidence pack could not be finished: {exc}"}


def _complete(folder: Path, report: dict[str, Any]) -> dict[str, Any]:
    record = mu.read_record(str(folder))
    if not record.get("complete"):
        # Only what the playbook could not record: a host lost alone in its batch, the run stopped outside the
        # waves. A gate's failure is in the record already, its messages cleared of secrets by the playbook.
        failure = report.get("failure") or {}
        failure = {k: failure.get(k) for k in ("host", "wave", "gate", "task", "why")} \
            if failure.get("gate") in ("unreachable", "playbook") else None
        entries = []
        for node in record.get("nodes") or []:
            if failure and node.get("host") == failure.get("host") and node.get("result") not in ("failed", "ok"):
                node = {**node, "result": "lost", "note": f"{failure.get('gate')}: {str(failure.get('why'))[:500]}"}
            entries.append(node)
        signature = record.get("signature") or {}
        key, home = signature.get("key") or "", signature.get("gnupg_home") or ""
        inputs = {**{k: record.get(k) for k in ("release", "inventory", "plan", "resumed_from", "started_at")},
                  "complete": True, "nodes": entries, "failure": failure}
        mu.write_pack(str(folder), mu.build_record(inputs, signing_key=key, gnupg_home=home),
                      signing_key=key, gnupg_home=home)
        record = mu.read_record(str(folder))
    return {"dir": str(folder), "signed": (folder / mu.SIGNATURE).is_file(), "status": record.get("status"),
            "key": (record.get("signature") or {}).get("key")}

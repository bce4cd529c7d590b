# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Downgrade protection: a bundle's release and build time, read from its signed manifest.json, against
the record of the bundle a node accepted last (``atlas_bundle_record``, roles/layout).

``atlasctl bundle build`` writes ``release`` (the spec's ``release``, else its ``name``) and ``built`` (UTC,
``2026-01-31T12:00:00Z``; kept from the previous manifest when nothing else in it changed) into the
manifest, so the signature covers them. A bundle is older than another when it was built earlier: an
attacker who can write the bundle share can put back an old signed bundle (a replay), but cannot make a
signed manifest with a later build time. The release id names the bundle in messages.

One implementation for the roles (filter ``bundle_record_check``, roles/bundle_trust), which refuse an
older bundle and write the record, and ``atlasctl bundle push``, which compares before it sends.

Standard library only.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass

RECORD_FORMAT = 1
BUILT_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
ALLOW_FIX = ("to go back on purpose, say so: atlasctl bundle push|rollout --allow-downgrade, or "
             "ansible-playbook -e atlas_allow_downgrade=true")


class RecordError(ValueError):
    """A release, build time or record that cannot be read; the message names where."""


@dataclass(frozen=True)
class Judgement:
    """``problem``: the refusal ('' when accepted); ``warning``: said loudly, not refused; ``record``: what the
    node records now (None: leave its record as it is)."""

    problem: str = ""
    warning: str = ""
    record: dict | None = None

    @property
    def record_text(self) -> str:
        return render_record(self.record) if self.record is not None else ""

    def as_dict(self) -> dict:
        return {"problem": self.problem, "warning": self.warning, "record": self.record,
                "record_text": self.record_text}


def now_built() -> str:
    """The build time a manifest records: now, UTC, to the second."""
    return datetime.datetime.now(datetime.UTC).strftime(BUILT_FORMAT)


def _built(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise RecordError(f"{where}: built must be a UTC time such as 2026-01-31T12:00:00Z, got {value!r}")
    try:
        datetime.datetime.strptime(value, BUILT_FORMAT)
    except ValueError:
        raise RecordError(f"{where}: built {value!r} is not a UTC time such as 2026-01-31T12:00:00Z") from None
    return value


def _release(value: object, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 128 or not value.isprintable():
        raise RecordError(f"{where}: release must be a name of printable characters (at most 128), got {value!r}")
    return value


def release_of(data: object, source: str) -> dict | None:
    """{name, release, built} of a bundle's parsed manifest.json, or None when it carries neither (a manifest
    an older atlasctl built). One without the other, or either malformed, is a RecordError."""
    if not isinstance(data, dict) or ("release" not in data and "built" not in data):
        return None
    if "release" not in data or "built" not in data:
        missing = "release" if "release" not in data else "built"
        raise RecordError(f"{source}: has {'built' if missing == 'release' else 'release'} but no {missing}; "
                          "rebuild the bundle with `atlasctl bundle build`")
    name = data.get("name")
    return {"name": name if isinstance(name, str) else None, "release": _release(data["release"], source),
            "built": _built(data["built"], source)}


def parse_record(text: str, source: str) -> dict:
    """A node's record ({format, name, release, built, manifest_sha256}), as :func:`render_record` writes it."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RecordError(f"{source}: not a bundle record (invalid JSON: {exc})") from None
    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
        raise RecordError(f"{source}: not a bundle record (format {RECORD_FORMAT})")
    return {"format": RECORD_FORMAT, "name": data.get("name"), "release": _release(data.get("release"), source),
            "built": _built(data.get("built"), source), "manifest_sha256": data.get("manifest_sha256")}


def render_record(record: dict) -> str:
    """The record's text: sorted keys, so the same bundle gives the same bytes (idempotent writes)."""
    return json.dumps(record, indent=1, sort_keys=True) + "\n"


def _describe(release: dict) -> str:
    return f"release {release['release']} built {release['built']}"


def judge(data: object, sha256: str, record_text: str | None, *, allow_downgrade: bool = False,
          where: str = "this node", source: str = "manifest.json") -> Judgement:
    """The verified manifest (``data``, parsed; ``sha256`` of its bytes) against the node's record
    (``record_text``; None when the node has none yet). Refused when it is older (built earlier), or
    cannot be ordered (no build time) while the node has a record, unless ``allow_downgrade``. The record to
    write is the accepted bundle's, downgrades allowed on purpose included: it says what the node runs, so
    later runs of that bundle need no flag (a flag every run needs would end up set for good)."""
    try:
        release = release_of(data, source)
        record = parse_record(record_text, f"{where}: its bundle record") if record_text else None
    except RecordError as exc:
        if not allow_downgrade:
            return Judgement(problem=f"{exc}. Downgrade protection cannot judge this bundle; " + ALLOW_FIX)
        return Judgement(warning=f"DOWNGRADE ALLOWED unjudged: {exc}")
    new = None if release is None else {"format": RECORD_FORMAT, **release, "manifest_sha256": sha256}
    if release is None:
        unordered = (f"{source} carries no release and build time (an older atlasctl built it), so it cannot be "
                     "ordered against other bundles; rebuild and sign it with this atlasctl")
        if record is None:
            return Judgement(warning=f"{unordered}: downgrade protection starts with the first bundle that does.")
        if not allow_downgrade:
            return Judgement(problem=f"{where}: {unordered}. This node last accepted {_describe(record)}: the bundle "
                                     "is refused as a possible downgrade; " + ALLOW_FIX)
        return Judgement(warning=f"{where}: DOWNGRADE ALLOWED: {unordered}; the node keeps its record of "
                                 f"{_describe(record)}.")
    if record is not None and release["built"] < record["built"]:
        said = (f"{where}: bundle {release['name']} ({_describe(release)}) is OLDER than the bundle this node last "
                f"accepted ({record['name']}, {_describe(record)})")
        if not allow_downgrade:
            return Judgement(problem=f"{said}: a downgrade, refused (an old signed bundle put back on the share "
                                     "is refused so); " + ALLOW_FIX)
        return Judgement(warning=f"{said}: DOWNGRADE ALLOWED (atlas_allow_downgrade).", record=new)
    return Judgement(record=new)

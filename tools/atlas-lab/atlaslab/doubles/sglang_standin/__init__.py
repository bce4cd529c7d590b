"""The lab's SGLang stand-in, packaged as a pure-python wheel for the offline bundle.

The package ``sglang`` under this directory answers ``python -m sglang.launch_server <real flags>`` on lab
nodes (python3 standard library only). Its command line is built from the schema extracted from the real
release (``collections/ansible_collections/atlas/serving/schemas/sglang-<version>.json``), shipped inside
the wheel as ``sglang/_atlas_standin/schema.json``.

``build_standin_wheel(out_dir)`` writes ``atlas_sglang_standin-<version>-py3-none-any.whl`` and a
``requirements.lock`` next to it; a node installs it with::

    python3 -m venv V && V/bin/pip install --no-index --no-deps --find-links DIR -r DIR/requirements.lock

Multi-node (``--nnodes N --node-rank R --dist-init-addr HOST:PORT``, the lab's multi-node engine): rank 0
opens its HTTP port only once every rank has joined the dist-init address; every generation step is a
collective with all ranks, so a stopped or dead rank stalls the instance (rank 0's ``/health`` 503 after
``SGLANG_HEALTH_CHECK_TIMEOUT``, exit by the ``--watchdog-timeout`` watchdog); ranks >= 1 serve only the
dummy ``/health``, ``/health_generate``, ``/ping`` (always 200). Behaviour and sources:
``sglang/_atlas_standin/dist.py`` and docs/multinode-serving.md, section "Lab".
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from atlasctl.engine_schema.sglang import PINNED_VERSION, schema_path
from atlasctl.errors import AtlasError

DIST_NAME = "atlas_sglang_standin"
PROJECT_NAME = "atlas-sglang-standin"
VERSION = PINNED_VERSION
SOURCE_DIR = Path(__file__).resolve().parent / "sglang"
SCHEMA_MEMBER = "sglang/_atlas_standin/schema.json"
LOCK_NAME = "requirements.lock"
_ZIP_DATE = (2020, 1, 1, 0, 0, 0)

METADATA = f"""Metadata-Version: 2.1
Name: {PROJECT_NAME}
Version: {VERSION}
Summary: atlas-serving lab stand-in for SGLang {VERSION}: real command line, endpoints and metric names
Requires-Python: >=3.9
"""
WHEEL = """Wheel-Version: 1.0
Generator: atlasctl
Root-Is-Purelib: true
Tag: py3-none-any
"""


def wheel_name(version: str = VERSION) -> str:
    return f"{DIST_NAME}-{version}-py3-none-any.whl"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _sources() -> list[tuple[str, bytes]]:
    files = []
    for path in sorted(SOURCE_DIR.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix in {".py", ".json"}:
            if path.name == "schema.json":
                continue  # a stray local copy; the committed schema is authoritative
            files.append((path.relative_to(SOURCE_DIR.parent).as_posix(), path.read_bytes()))
    return files


def _write(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)


def build_standin_wheel(out_dir: Path, schema: Path | None = None) -> Path:
    """Build the stand-in wheel (same input, same bytes) and ``requirements.lock`` in ``out_dir``."""
    schema = Path(schema) if schema else schema_path(VERSION)
    if not schema.is_file():
        raise AtlasError(f"SGLang schema {schema} is missing",
                         fix=f"run python -m atlasctl.engine_schema.sglang {VERSION}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dist_info = f"{DIST_NAME}-{VERSION}.dist-info"
    members = [*_sources(), (SCHEMA_MEMBER, schema.read_bytes()),
               (f"{dist_info}/METADATA", METADATA.encode()), (f"{dist_info}/WHEEL", WHEEL.encode()),
               (f"{dist_info}/top_level.txt", b"sglang\n")]
    record = [_record_line(name, data) for name, data in members] + [f"{dist_info}/RECORD,,"]
    wheel = out_dir / wheel_name()
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w") as zf:
        for name, data in members:
            _write(zf, name, data)
        _write(zf, f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode())
    tmp.replace(wheel)
    (out_dir / LOCK_NAME).write_text(f"{PROJECT_NAME}=={VERSION}\n", encoding="utf-8")
    return wheel

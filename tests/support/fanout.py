"""Fan-out staging in a test: a free local port, a small bundle, and comparing two copies."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

from atlasctl import bundle

# the loopback addresses the fan-out tests give their nodes: a free port is free on each
LOOPBACKS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
BIG = "models/m/model-00001-of-00002.safetensors"


def free_port() -> int:
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        try:
            for address in LOOPBACKS[1:]:
                with socket.socket() as other:
                    other.bind((address, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port on the loopback addresses")


def make_bundle(root: Path, big: int = 3 << 20) -> str:
    """A signed-bundle stand-in (manifest only; the signature is checked on the controller): a model with a large
    shard, a CANN package; the manifest's sha256."""
    (root / "models" / "m").mkdir(parents=True)
    (root / BIG).write_bytes(os.urandom(big))
    (root / "models" / "m" / "config.json").write_text('{"layers": 2}')
    (root / "cann").mkdir()
    (root / "cann" / "toolkit.run").write_bytes(b"#!/bin/sh\necho installer\n" * 100)
    bundle.write_manifest(root, "b", release="bank-1")
    (root / "manifest.json.asc").write_text("-----BEGIN PGP SIGNATURE-----\n")
    return hashlib.sha256((root / "manifest.json").read_bytes()).hexdigest()


def same_tree(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file() and not p.name.startswith(".atlas"))
    return files == sorted(p.relative_to(b).as_posix() for p in b.rglob("*")
                           if p.is_file() and not p.name.startswith(".atlas")) and all(
        (a / f).read_bytes() == (b / f).read_bytes() for f in files)

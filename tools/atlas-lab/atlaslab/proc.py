"""Running host commands with errors that name the command and the fix."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Sequence

from atlasctl.errors import EnvironmentProblem

log = logging.getLogger(__name__)


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    input_text: str | None = None,
    fix: str | None = None,
    timeout: float | None = 600,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv``; on failure raise EnvironmentProblem with stderr and ``fix``."""
    log.debug("run: %s", " ".join(argv))
    try:
        proc = subprocess.run(
            list(argv), input=input_text, capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError as exc:
        raise EnvironmentProblem(
            f"command not found: {argv[0]}", fix=fix or f"install the package that provides {argv[0]}"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise EnvironmentProblem(f"command timed out after {timeout}s: {' '.join(argv)}", fix=fix) from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise EnvironmentProblem(
            f"command failed (exit {proc.returncode}): {' '.join(argv)}: {' | '.join(detail)}", fix=fix
        )
    return proc


def require_tools(*names: str) -> None:
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        raise EnvironmentProblem(
            f"missing host tools: {', '.join(missing)}",
            fix="apt-get install debootstrap systemd-container nftables zstd openssh-client iproute2 rsync",
        )

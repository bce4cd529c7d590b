"""Helpers for the role tests: read a playbook run's recap, and swap a file when an installer is executed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path


def recap(result: subprocess.CompletedProcess) -> dict[str, int]:
    match = re.search(r"localhost\s*:\s*(.*)", result.stdout.split("PLAY RECAP")[-1])
    assert match, result.stdout + result.stderr
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}


def ok(result: subprocess.CompletedProcess) -> dict[str, int]:
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return recap(result)


def swap_at_exec(tmp: Path, bundle: Path, glob: str) -> tuple[Path, Path]:
    """A `bash` first on PATH that plays the account that can write the bundle: at the last moment, as an
    installer starts, it replaces every installer in the bundle with its own, then runs the real bash.
    Returns the directory to put first on PATH and the file the replacement leaves when it runs."""
    pwned, bindir = tmp / "pwned", tmp / "swap-bin"
    bindir.mkdir()
    wrapper = bindir / "bash"
    wrapper.write_text(f"""#!/bin/bash
for f in {bundle}/{glob}; do printf '#!/bin/sh\\ntouch {pwned}\\n' > "$f"; done
exec /bin/bash "$@"
""")
    wrapper.chmod(0o755)
    return bindir, pwned

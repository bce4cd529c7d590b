"""Building and verifying evidence packs in a test: a controller home, the hostvars a rollout leaves, the pack."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from ansible_collections.atlas.serving.plugins.module_utils import evidence as mu

API_KEY = "sk-atlas-evidence-0f3c9d7e2b"  # serving_api_key, in the hostvars and in a failure's message
ENV_KEY = "vllm-env-key-71d0c2aa95"  # VLLM_API_KEY, in serving_env_extra and in the rendered env file
VAULT_KEY = "vault-key-5e8812bb40"  # what an inventory's vault_serving_api_key holds
PLAN = [{"name": "canary", "hosts": ["n1"], "index": 1, "skipped": False, "batches": [1]},
        {"name": "east", "hosts": ["n2", "n3"], "index": 2, "skipped": False, "batches": [1]}]


class Home:
    """A throwaway gpg home with one no-passphrase signing key."""

    def __init__(self, path: Path, uid: str):
        self.path = path
        path.mkdir(mode=0o700, parents=True)
        self._gpg("--quick-gen-key", uid, "ed25519", "sign", "never")
        listing = self._gpg("--with-colons", "--list-keys").stdout.decode()
        self.fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))

    def _gpg(self, *args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(["gpg", "--homedir", str(self.path), "--batch", "--no-tty", "--passphrase", "", *args],
                              capture_output=True, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc

    def export(self, dest: Path) -> Path:
        dest.write_bytes(self._gpg("--export", self.fingerprint).stdout)
        return dest

    def sign(self, data: Path, dest: Path) -> None:
        self._gpg("--yes", "--local-user", self.fingerprint, "--armor", "--detach-sign", "--output", str(dest),
                  str(data))

    def close(self) -> None:
        subprocess.run(["gpgconf", "--homedir", str(self.path), "--kill", "gpg-agent"], check=False,
                       capture_output=True)


def hostvars(env_sha256: str = "ab" * 32) -> dict:
    """What the rollout leaves in the hostvars: n1 passed every gate, n2 failed its SLO gate and went back,
    n3 was not reached; secrets where an inventory and a run put them."""
    shared = {"serving_api_key": API_KEY, "serving_env_extra": {"VLLM_API_KEY": ENV_KEY, "OMP_NUM_THREADS": "8"},
              "vault_serving_api_key": VAULT_KEY, "health_api_key": API_KEY,
              "atlas_bundle_manifest_sha256": "cd" * 32, "atlas_bundle_signer": "EF" * 20}
    record = {"release_id": "r2", "engine": "vllm", "engine_release": "vllm-ascend-0.9.1", "model_version": "9f" * 8,
              "runtime": "venv", "port": 8000}
    return {
        "n1": {**shared, "rollout_converged": False, "rollout_unit": ["n1"],
               "rollout_node_report": {"host": "n1", "wave": "canary", "previous": "r1", "release": "r2",
                                       "result": "ok", "unit": ["n1"], "at": "2026-03-01T10:02:00Z",
                                       "slo": {"completed": 8, "failed": 0, "violations": [],
                                               "metrics": {"e2el_ms": {"p95": 210.0}},
                                               "thresholds": {"e2el_ms": 60000}}},
               "rollout_health_probe": {"health": 200, "waited_s": 2.5, "completion_tokens": 8, "record": record,
                                        "progress": {"verdict": "ok", "reason": "the completion finished"},
                                        "invocation": {"module_args": {"api_key": API_KEY}}},
               "health_probe": {"health": 200, "record": record},
               "ansible_facts": {"cann": {"driver": {"installed": True, "version": "24.1.rc1"},
                                          "firmware": {"installed": True, "version": "7.5.0.1.129"},
                                          "toolkit": {"installed": True, "version": "8.3.RC1"}}},
               "rollout_readback": {"files": [
                   {"path": "/etc/atlas/serving/releases/r2/atlas-serving.env", "checksum": env_sha256},
                   {"path": "/etc/atlas/serving/releases/r2/atlas-serving.args", "checksum": "12" * 32}]}},
        "n2": {**shared, "rollout_converged": False, "rollout_unit": ["n2"],
               "rollout_failure": {"host": "n2", "wave": "east", "gate": "slo", "task": "Rollout | slo | assert",
                                   "why": f"n2: SLO gate: e2el p95 900 ms > 300 ms (sent with {API_KEY})",
                                   "previous": "r1", "release": "r2", "converged": False, "via_unit": False,
                                   "lost": [], "unit": ["n2"], "measured": {"metrics": {"e2el_ms": {"p95": 900.0}}}},
               "health_probe": {"health": 200, "record": {**record, "release_id": "r1"}}},
        "n3": dict(shared),
    }


def build(folder: Path, keys=None, hv: dict | None = None, **inputs) -> Path:
    controller = keys[0] if keys else None
    record = mu.build_record({"release": "r2", "inventory": "/site/inventory/bank", "plan": PLAN,
                              "started_at": "2026-03-01T10:00:00Z",
                              "nodes": mu.nodes(hv or hostvars(), PLAN, []), **inputs},
                             signing_key=controller.fingerprint if controller else "",
                             gnupg_home=str(controller.path) if controller else "")
    written = mu.write_pack(str(folder), record, signing_key=controller.fingerprint if controller else "",
                            gnupg_home=str(controller.path) if controller else "")
    assert written["error"] == "", written
    return folder


def verify_cli(pack: Path, keys, *extra: str) -> list[str]:
    controller, _, keyring = keys
    return ["evidence", "verify", str(pack), "--keyring", str(keyring), "--fingerprint", controller.fingerprint,
            *extra]


SECRETS = (API_KEY, ENV_KEY, VAULT_KEY)


@contextlib.contextmanager
def evidence_keys(tmp: Path):
    """The controller's evidence key (its public keyring) and a stranger's, two throwaway GnuPG homes under ``tmp``:
    (controller, stranger, keyring)."""
    controller, stranger = Home(tmp / "controller", "evidence@controller"), Home(tmp / "stranger", "x@elsewhere")
    try:
        yield controller, stranger, controller.export(tmp / "controller.gpg")
    finally:
        controller.close()
        stranger.close()


def secrets_in(folder: Path, needles=SECRETS) -> list[str]:
    """Each file under ``folder`` that holds one of ``needles``, with the needle."""
    return [f"{path.name}: {needle}" for path in folder.rglob("*") if path.is_file()
            for needle in needles if needle.encode() in path.read_bytes()]

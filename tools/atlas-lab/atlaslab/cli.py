"""`atlas-lab up|down|status|ssh|power|npu|bundle|hold`: the simulated Atlas fleet (systemd-nspawn nodes).

The lab's own command, apart from the product's `atlasctl`: the product never imports the lab.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from atlasctl import bundle, exitcodes
from atlasctl.cli import run
from atlasctl.errors import UsageError
from atlasctl.paths import cache_dir
from atlaslab import api, npu, paths, signing
from atlaslab.lock import hold_lab

DEFAULT_SPEC = Path("inventory/lab/bundle.yml")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atlas-lab", description="The simulated Atlas fleet of the test lab: "
                                     "bring it up or down, reach its nodes, inject faults, build its bundle.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    lsub = parser.add_subparsers(dest="lab_command", metavar="ACTION", required=True)

    up = lsub.add_parser("up", help="build the base (once, cached) and boot every node of lab.yml")
    up.add_argument("--config", default=None, help="lab fleet file (default: inventory/lab/lab.yml)")
    up.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for SSH (default: 120)")
    up.add_argument("--json", action="store_true", help="print the lab state as JSON")
    up.add_argument("--hdk", default=None, metavar="DRIVER/FIRMWARE",
                    help="the HDK new nodes start on (default: lab.yml's driver_version/firmware_version)")
    up.set_defaults(func=_up)

    down = lsub.add_parser("down", help="power nodes off and remove the lab (keeps the base cache)")
    down.set_defaults(func=_down)

    status = lsub.add_parser("status", help="per node: address, groups, running/stopped, SSH reachable")
    status.add_argument("--json", action="store_true", help="print as JSON")
    status.set_defaults(func=_status)

    ssh = lsub.add_parser("ssh", help="ssh to a node with the lab key and pinned host key")
    ssh.add_argument("node")
    ssh.add_argument("remote", nargs=argparse.REMAINDER, metavar="COMMAND", help="command to run (optional)")
    ssh.set_defaults(func=_ssh)

    power = lsub.add_parser("power", help="power a node off (clean shutdown) or on (boot, wait for SSH)")
    power.add_argument("node")
    power.add_argument("action", choices=("off", "on"))
    power.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for SSH on `on`")
    power.set_defaults(func=_power)

    npu_p = lsub.add_parser("npu", help="set a node's simulated NPU state for fault tests")
    npu_p.add_argument("node")
    npu_p.add_argument("--device", type=int, default=None, help="NPU id (default: every NPU)")
    npu_p.add_argument("--health", choices=npu.HEALTH_VALUES, default=None)
    npu_p.add_argument("--hbm-used-mb", type=int, default=None)
    npu_p.add_argument("--driver", choices=("loaded", "unloaded"), default=None)
    npu_p.add_argument("--link", choices=("up", "down"), default=None, help="the NPU port's link (hccn_tool -link -g)")
    npu_p.add_argument("--net-health", choices=npu.NET_HEALTH_VALUES, default=None,
                       help="Fault holds the port's net health at Fault; Success lifts that")
    npu_p.add_argument("--unreachable", metavar="ADDRESS", default=None,
                       help="pings from this node's NPUs to ADDRESS fail (a peer NPU's address)")
    npu_p.add_argument("--reachable", metavar="ADDRESS", default=None, help="undo --unreachable ADDRESS")
    npu_p.add_argument("--json", action="store_true", help="print the resulting npu.json")
    npu_p.set_defaults(func=_npu)

    build = lsub.add_parser("bundle", help="build the lab's bundle (doubles of Huawei's packages, the real engine "
                            "wheels, a tiny model) into the lab's bundle directory, signed with the lab's key")
    build.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help=f"bundle spec (default: {DEFAULT_SPEC})")
    build.add_argument("--out", type=Path, default=None, help="bundle directory (default: the lab's)")
    build.set_defaults(func=_bundle)

    hold = lsub.add_parser("hold", help="hold the lab lock while COMMAND runs (default: a shell); the atlas-lab "
                           "commands it runs go ahead under that hold, anyone else's wait")
    hold.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND", help="command to run (optional)")
    hold.set_defaults(func=_hold)
    return parser


def _print_table(state: api.LabState) -> None:
    print(f"{'NODE':<14} {'IP':<15} {'STATE':<8} {'SSH':<4} GROUPS")
    for n in state.nodes:
        print(f"{n.name:<14} {n.ip:<15} {n.state:<8} {'yes' if n.ssh else 'no':<4} {','.join(n.groups)}")


def _up(args: argparse.Namespace) -> int:
    state = api.up(args.config, timeout=args.timeout, hdk=args.hdk)
    if args.json:
        print(json.dumps(state.to_dict(), indent=2))
        return exitcodes.OK
    if state.already_up:
        print("lab is already up and healthy; nothing to do")
    else:
        print(f"lab up in {state.seconds:.1f}s ({len(state.nodes)} nodes); inventory: {state.inventory_path}")
    _print_table(state)
    return exitcodes.OK


def _down(args: argparse.Namespace) -> int:
    removed = api.down()
    print(f"lab down ({len(removed)} item(s) removed)" if removed else "lab is already down")
    return exitcodes.OK


def _status(args: argparse.Namespace) -> int:
    state = api.status()
    if args.json:
        print(json.dumps(state.to_dict(), indent=2))
    else:
        _print_table(state)
    healthy = all(n.state == "running" and n.ssh for n in state.nodes)
    return exitcodes.OK if healthy else exitcodes.FAILED


def _ssh(args: argparse.Namespace) -> int:
    remote = [a for a in args.remote if a != "--"] if args.remote[:1] == ["--"] else list(args.remote)
    argv = api.ssh_argv(args.node, remote, tty=not remote and sys.stdin.isatty())
    sys.stdout.flush()
    os.execvp(argv[0], argv)
    return exitcodes.FAILED  # not reached


def _power(args: argparse.Namespace) -> int:
    status = api.power(args.node, args.action, timeout=args.timeout)
    print(f"{status.name}: {status.state}, ssh {'reachable' if status.ssh else 'unreachable'}")
    return exitcodes.OK


def _npu(args: argparse.Namespace) -> int:
    state = api.set_npu(args.node, device=args.device, health=args.health, hbm_used_mb=args.hbm_used_mb,
                        driver=args.driver)
    network = api.set_npu_network(args.node, device=args.device, link=args.link and args.link.upper(),
                                  net_health=args.net_health, unreachable=args.unreachable,
                                  reachable=args.reachable)
    if args.json:
        print(json.dumps(dict(state, network=network), indent=2))
    else:
        ports = {d["id"]: d for d in network["devices"]}
        print(f"{args.node}: driver {'loaded' if state['driver_loaded'] else 'unloaded'}; "
              + ", ".join(f"npu{d['id']} {d['health']} {d['hbm_used_mb']}MB"
                          f" link {ports.get(d['id'], {}).get('link', '?')}" for d in state["devices"])
              + (f"; unreachable: {', '.join(network['unreachable'])}" if network.get("unreachable") else ""))
    return exitcodes.OK


def _bundle(args: argparse.Namespace) -> int:
    spec = bundle.BundleSpec.load(args.spec)
    out = args.out or paths.bundle_dir()
    manifest = bundle.build_bundle(spec, out, cache_dir(), sign_key=signing.ensure_key(), sign_home=signing.homedir())
    print(f"lab bundle {manifest['name']} at {out} (signed with the lab's key {signing.ensure_key()})")
    for kind, files, size in bundle.iter_summary(manifest):
        print(f"  {kind:<8} {files:>5} files {size / 2**20:>10.1f} MiB")
    return exitcodes.OK


def _hold(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else list(args.command)
    command = command or [os.environ.get("SHELL") or "/bin/sh"]
    with hold_lab("atlas-lab hold " + " ".join(" ".join(command).split())[:200]):
        try:
            return subprocess.call(command)
        except OSError as exc:
            raise UsageError(f"{command[0]}: cannot run it ({exc.strerror})",
                             fix="name a command on PATH, or none for a shell") from None


def main(argv: list[str] | None = None) -> int:
    return run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())

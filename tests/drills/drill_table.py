"""The fault drills: one table, one row per fault, run in order on one converged lab.

Each row injects a fault, measures what the product did (observed outcome, client requests
that failed through the branch gateways while it happened, data lost), restores the fleet
and says whether what happened is what the product promises (expected outcome). The rows
run in table order; each leaves the fleet converged (every engine healthy, every backend
enabled at its gateway) for the next.

The drills themselves live in one module per family of faults, over drill_common (the row
types and the helpers they share): drills_models (model and CANN files, the fan-out),
drills_rollout (engine and rollout faults), drills_keys (API keys), drills_platform
(platform upgrades) and drills_instance (the two-node instance).
"""

from __future__ import annotations

from drill_common import Drill
from drills_instance import instance_out_and_back, npu_link_down, platform_unit, rank_frozen, rank_power_off
from drills_keys import api_keys, key_rollout
from drills_models import (
    FANOUT_PEER,
    OTHER_CANN,
    corrupted_fanout_peer,
    corrupted_shard,
    disk_full,
    install_killed,
    tampered_cann,
)
from drills_platform import (
    platform_canary_fails,
    platform_downgrade,
    platform_power_off,
    platform_upgrade,
    site_yml_live,
)
from drills_rollout import (
    bad_flag_release,
    concurrent_rollouts,
    crash_loop,
    gateway_restart,
    node_lost_before_wave,
    power_off_mid_wave,
)

# --- the table ---------------------------------------------------------------------------------------

DRILLS = [
    Drill("corrupt-shard", "new model version with one flipped byte in a shard (atlas-n3)",
          "refused naming the shard; engine keeps serving (same PID); current link unchanged; 0 failed",
          corrupted_shard),
    Drill("tampered-cann", f"bundle copy with one flipped byte in the CANN {OTHER_CANN} toolkit .run (atlas-n4)",
          "refused before any installer runs, naming the package; installed CANN unchanged; 0 failed",
          tampered_cann),
    Drill("disk-full", "models filesystem of atlas-n4 full (128 KiB free) while staging a new model version",
          "refused before staging, naming the path, the need and the space free; current unchanged, engine keeps "
          "serving; after freeing space the "
          "next run converges; 0 failed", disk_full),
    Drill("crash-loop", "atlas-n4's engine SIGKILLed each time it comes up, until systemd gives up",
          "systemd restarts it up to its start limit, then the unit stays failed; doctor names the start limit; "
          "the health stage fails; the serving stage brings it back; gateway routes around it: 0 failed "
          "(responses in flight at a kill are the crash's own)",
          crash_loop),
    Drill("api-key", "API key set on the west branch, then rotated: requests with no key and with the old key",
          "through the gateway, no key and old key: 401; current key: 200; /health not forwarded: 404; atlasctl "
          "health and doctor pass; the keys in no output, log or artifact",
          api_keys),
    Drill("key-rollout", "the API key rotated on branch east with an overlap, by staged rollouts "
          "(`atlasctl rollout --vars keys.yml`, 0600) while clients switch keys",
          "two rollouts complete; east accepts both keys during the overlap, only the new one after; the keys in "
          "no output or artifact; 0 failed", key_rollout),
    Drill("install-killed", f"atlas-n4 powered off during the CANN {OTHER_CANN} toolkit installer",
          "the run fails; the next run installs completely; back to 8.5.0; engine healthy", install_killed),
    Drill("concurrent-rollouts", "a second `atlasctl rollout` while one runs",
          "second refused (exit 2, 'already running'); the first runs its course; fleet unchanged; 0 failed",
          concurrent_rollouts),
    Drill("corrupt-fanout-peer", f"a byte of {FANOUT_PEER}'s copy flipped while a `bundle push --fan-out` runs "
          "(its receivers pull from it in the last round)",
          "the receivers refuse the corrupted copy naming the shard and pull it from a verified source; the corrupted "
          "peer is repaired; every node verified, the controller sends the bundle about once; 0 failed",
          corrupted_fanout_peer),
    Drill("bad-flag-release", "rollout of a release with an unknown engine flag, lint overridden",
          "canary fails to start and is rolled back; rollout stops; fleet on the old release; 0 failed",
          bad_flag_release),
    Drill("power-off-mid-wave", "atlas-n2 powered off after its wave drained it",
          "rollout stops at atlas-n2 (wave east); atlas-n4 keeps the old release; after power-on --resume "
          "completes; 0 failed", power_off_mid_wave),
    Drill("node-lost", "atlas-n2 powered off before the east wave starts, under load",
          "atlas-n1 (the branch's last healthy backend) not drained nor restarted; rollout stops there, west on the "
          "old release; after power-on --resume completes; 0 failed",
          node_lost_before_wave),
    Drill("gateway-restart", "`systemctl restart nginx` on atlas-gw-east during a rollout, under load",
          "rollout completes, fleet on the new release; client failures: what the restart costs",
          gateway_restart),
    # the platform moves (docs/platform-upgrades.md): refused by site.yml, then through the rollout, level A -> B -> C
    Drill("site-yml-live", "site.yml with platform level B (driver 25.5.1, firmware, CANN 9.1.0) on the live lab",
          "refused at preflight naming every serving node and the rollout command; nothing changed on any node; "
          "0 failed", site_yml_live),
    Drill("platform-canary-fails", "rollout of level B whose SLO gate fails on the canary after its platform moved",
          "the canary back on its release on CANN 8.5.0 (kept beside 9.1.0), the driver stays 25.5.1 as planned; the "
          "rollout stops; nothing else changed; 0 failed", platform_canary_fails),
    Drill("platform-upgrade", "the whole lab from level A to level B through `atlasctl rollout`, under load",
          "every node on driver 25.5.1 and CANN 9.1.0; the previous CANN 8.5.0 still installed and pinned by the "
          "previous release; 0 failed", platform_upgrade),
    Drill("platform-power-off", "level C over branch east; atlas-n2 powered off during its driver install/reboot",
          "the rollout stops with atlas-n2 drained and named; the old release does not start at power-on; --resume "
          "completes; 0 failed", platform_power_off),
    Drill("platform-downgrade", "branch east from level C back to level B (driver 25.5.2 -> 25.5.1) through "
          "`atlasctl rollout`, first without, then with --allow-downgrade",
          "refused before any node is touched without the flag; with it firmware then driver go back by the "
          "installers' --upgrade, the reboot, the release; 0 failed", platform_downgrade),
    # the multi-node drills, last: the first converges the lab's two-node instance (atlas-n3 + atlas-n4)
    Drill("instance-out-and-back", "two-node instance: a release rolled over branch west, then one that fails the "
          "entry's SLO gate, under load",
          "out as one unit (both ranks one batch, head first), then atlas-n5; back as one unit (rank 1 follows its "
          "entry), atlas-n5 untouched; 0 failed", instance_out_and_back),
    Drill("rank-frozen", "two-node instance: every process of rank 1 (atlas-n4) SIGSTOPped, under load",
          "atlasctl health reports it hung; recover.yml drains the entry, restarts both ranks together, enables "
          "it; release and model unchanged (0 data lost); 0 failed (the request in flight is retried elsewhere)",
          rank_frozen),
    Drill("npu-link-down", "two-node instance: NPU 2 of atlas-n4 link down, then a rollout of the instance",
          "the rollout stops at its network gate naming atlas-n4, NPU 2 and the link; neither rank touched",
          npu_link_down),
    Drill("rank-power-off", "two-node instance: atlas-n4 powered off while the instance rolls",
          "the unit rolls back (head stopped, entry drained, atlas-n5 serves); after power-on --resume completes; "
          "0 failed (the request in flight on the instance is retried on atlas-n5 by the gateway)", rank_power_off),
    Drill("platform-unit", "two-node instance: level C rolled over branch west (both ranks' driver and firmware)",
          "both ranks move together (stop, driver, reboot, NPU network verified again), then atlas-n5; 0 failed",
          platform_unit),
]

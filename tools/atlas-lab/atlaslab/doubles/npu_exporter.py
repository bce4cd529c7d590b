#!/usr/bin/python3
"""npu-exporter simulator for lab nodes: Huawei's npu-exporter (MindCluster) ``/metrics``, from the simulated NPUs.

Installed on every lab node as /usr/local/sbin/atlas-lab-npu-exporter, run at boot by
atlas-lab-npu-exporter.service on the real one's default port, 8082. Python 3 standard library only.

Each scrape reads the node's simulated state as the other doubles do, through their own code: the NPUs from
/etc/atlas-lab/npu.json (the npu-smi simulator's ``load_state`` and ``with_holders``: the HBM an engine process
holds counts as used, as ``npu-smi info`` shows it) and the NPU ports from /etc/atlas-lab/hccn.json (the hccn_tool
double's ``load_state`` and ``net_health``). So ``atlas-lab npu NODE --health Critical`` or ``--link down`` shows
at the next scrape. Their code is loaded from where the lab installs them (ATLAS_LAB_NPU_SMI, ATLAS_LAB_HCCN_TOOL
override the paths; NPU_SMI_STATE, HCCN_TOOL_STATE the state files: tests).

Exported as the real one names them (docs/monitoring.md; MindCluster
docs/en/scheduling/api/npu_exporter/01_prometheus_metrics_api.md and component/npu-exporter/collector/metrics/),
every chip series with its card labels ``id``, ``model_name`` (chip name-type-version), ``vdie_id``,
``pcie_bus_info`` and the empty ``namespace``, ``pod_name``, ``container_name`` of a host process:

- ``machine_npu_nums``: the NPUs on the machine;
- ``npu_chip_info_health_status``: 1 healthy (npu-smi health OK), 0 unhealthy (Warning, Alarm, Critical),
  -1 unknown (the DCMI call failed: the simulated driver is not loaded; then no other chip series);
- ``npu_chip_info_error_code``: the chip's error code, only while it has one (health not OK);
- ``npu_chip_info_network_status``: 1 net health Success, 0 otherwise; ``npu_chip_info_link_status``: 1 UP,
  0 DOWN; both -1 when the NPU ports cannot be read (the real one: hccn_tool failed);
- ``npu_chip_info_hbm_used_memory``, ``npu_chip_info_hbm_total_memory`` (MB), ``npu_chip_info_utilization``
  (AI Core %), ``npu_chip_info_temperature`` (C), ``npu_chip_info_power`` (W);
- ``npu_chip_info_hbm_ecc_single_bit_error_cnt``, ``npu_chip_info_hbm_ecc_double_bit_error_cnt``: a device's
  ``hbm_ecc_single_bit_errors`` / ``hbm_ecc_double_bit_errors`` in npu.json, 0 when absent.

Flags as the real one's: ``-port`` (1025-40000), ``-ip`` (the listen address), ``-updateTime`` (accepted; every
scrape reads the state afresh).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import sys
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NPU_SMI = "/usr/local/bin/npu-smi"
HCCN_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"
DEFAULT_PORT = 8082
PORT_RANGE = (1025, 40000)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
HEALTHY, UNHEALTHY, UNKNOWN = 1, 0, -1
# name -> HELP, as the real collectors describe them (collector_for_npu.go, _hbm.go, _network.go, _utilization.go)
HELP = {
    "machine_npu_nums": "Amount of npu installed on the machine.",
    "npu_chip_info_health_status": "the npu health status",
    "npu_chip_info_error_code": "the npu error code",
    "npu_chip_info_network_status": "the npu network health status",
    "npu_chip_info_link_status": "the npu link status",
    "npu_chip_info_hbm_used_memory": "the npu hbm used memory",
    "npu_chip_info_hbm_total_memory": "the npu hbm total memory",
    "npu_chip_info_utilization": "the ai core utilization",
    "npu_chip_info_temperature": "the npu temperature",
    "npu_chip_info_power": "the npu power",
    "npu_chip_info_hbm_ecc_single_bit_error_cnt": "HBM Single Bit Error Count",
    "npu_chip_info_hbm_ecc_double_bit_error_cnt": "HBM Double Bit Error Count",
}


def load_double(name: str, path: str):
    """The module of a lab double installed as a script without a .py suffix (npu-smi, hccn_tool)."""
    loader = importlib.machinery.SourceFileLoader(name, path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    loader.exec_module(module)
    return module


def card_labels(dev: dict) -> dict[str, str]:
    """npu-exporter's card labels of one chip (CardLabel in collector/common/metrics_collector.go)."""
    vdie = f"{zlib.crc32(str(dev.get('serial_number', dev['id'])).encode()):08X}-{dev['id']:08X}"
    return {"container_name": "", "id": str(dev["id"]), "model_name": f"{dev['name']}-Ascend-V1",
            "namespace": "", "pcie_bus_info": dev["bus_id"], "pod_name": "", "vdie_id": vdie}


def chip_samples(dev: dict, port: dict | None, error_code: int) -> list[tuple[str, float]]:
    """(name, value) of one chip whose driver answers; ``port``: its NPU port in hccn.json, None unreadable."""
    healthy = dev.get("health") == "OK"
    out = [("npu_chip_info_health_status", HEALTHY if healthy else UNHEALTHY)]
    if not healthy:
        out.append(("npu_chip_info_error_code", error_code))
    out += [
        ("npu_chip_info_network_status", UNKNOWN if port is None else
         HEALTHY if port["net_health"] == "Success" else UNHEALTHY),
        ("npu_chip_info_link_status", UNKNOWN if port is None else HEALTHY if port["link"] == "UP" else UNHEALTHY),
        ("npu_chip_info_hbm_used_memory", dev["hbm_used_mb"]),
        ("npu_chip_info_hbm_total_memory", dev["hbm_total_mb"]),
        ("npu_chip_info_utilization", dev.get("aicore_pct", 0)),
        ("npu_chip_info_temperature", dev.get("temp_c", 0)),
        ("npu_chip_info_power", dev.get("power_w", 0)),
        ("npu_chip_info_hbm_ecc_single_bit_error_cnt", dev.get("hbm_ecc_single_bit_errors", 0)),
        ("npu_chip_info_hbm_ecc_double_bit_error_cnt", dev.get("hbm_ecc_double_bit_errors", 0)),
    ]
    return out


def ports(hccn_state: dict | None, hccn_tool) -> dict[int, dict]:
    """{npu: {link, net_health}} from the hccn_tool double's state (empty when it cannot be read)."""
    if not hccn_state:
        return {}
    return {d["id"]: {"link": d.get("link", "UP"), "net_health": hccn_tool.net_health(d)}
            for d in hccn_state.get("devices", [])}


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(state: dict, hccn_state: dict | None, hccn_tool, error_code: int) -> str:
    """The exposition text of one scrape: ``state`` as npu-smi sees it (holders applied), the NPU ports' state."""
    series: dict[str, list[str]] = {name: [] for name in HELP}
    series["machine_npu_nums"].append(f"machine_npu_nums {len(state['devices'])}")
    by_port = ports(hccn_state, hccn_tool)
    for dev in state["devices"]:
        labels = "{" + ",".join(f'{k}="{v}"' for k, v in card_labels(dev).items()) + "}"
        if not state.get("driver_loaded", True):
            samples = [("npu_chip_info_health_status", UNKNOWN)]
        else:
            samples = chip_samples(dev, by_port.get(dev["id"]), error_code)
        for name, value in samples:
            series[name].append(f"{name}{labels} {_number(value)}")
    lines = []
    for name, samples in series.items():
        if samples:
            lines += [f"# HELP {name} {HELP[name]}", f"# TYPE {name} gauge", *samples]
    return "\n".join(lines) + "\n"


class Collector:
    """Reads the state at each scrape with the doubles' own code (modules passed in, or loaded from the node)."""

    def __init__(self, npu_smi=None, hccn_tool=None):
        self.npu_smi = npu_smi or load_double("npu_smi", os.environ.get("ATLAS_LAB_NPU_SMI", NPU_SMI))
        self.hccn_tool = hccn_tool or load_double("hccn_tool", os.environ.get("ATLAS_LAB_HCCN_TOOL", HCCN_TOOL))

    def scrape(self) -> str:
        smi = self.npu_smi
        state = smi.load_state()
        if state.get("driver_loaded", True):
            state = smi.with_holders(state, smi.holders(smi.dev_dir(), os.environ.get("NPU_SMI_PROC", "/proc")))
        try:
            hccn_state = self.hccn_tool.load_state()
        except (OSError, ValueError):
            hccn_state = None
        return render(state, hccn_state, self.hccn_tool, int(smi.HEALTH_ERROR_CODE, 16))


def handler_for(collector: Collector) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "only /metrics")
                return
            try:
                body = collector.scrape().encode()
            except (OSError, ValueError, KeyError) as exc:
                self.send_error(500, f"cannot read the simulated NPU state: {exc}")
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's signature)
            pass

    return Handler


def server(ip: str, port: int, collector: Collector | None = None) -> ThreadingHTTPServer:
    """A bound server (``port`` 0: a free one, in ``server_address``); the caller runs ``serve_forever``."""
    return ThreadingHTTPServer((ip, port), handler_for(collector or Collector()))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="atlas-lab-npu-exporter", description=__doc__.splitlines()[0])
    parser.add_argument("-port", type=int, default=DEFAULT_PORT, help="the server port, range [1025-40000]")
    parser.add_argument("-ip", default="", help="the listen address (empty: every address)")
    parser.add_argument("-updateTime", type=int, default=0, help="accepted; every scrape reads the state")
    args = parser.parse_args(argv)
    if not PORT_RANGE[0] <= args.port <= PORT_RANGE[1]:
        parser.error(f"-port {args.port} is outside [{PORT_RANGE[0]}-{PORT_RANGE[1]}]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    httpd = server(args.ip, args.port)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

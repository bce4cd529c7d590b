"""hccn_tool command lines and parsers, /etc/hccn.conf, desired vs read-back (module_utils/hccn.py), run
against the lab's double as a subprocess (tests/unit/lab/test_hccn_tool_double.py's FakeNodes)."""

from __future__ import annotations

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import hccn
from hypothesis import given
from hypothesis import strategies as st

from support.hccn_nodes import FakeNodes

MASK, GW = "255.255.255.0", "10.20.0.1"

# Real outputs, verbatim (docs/npu-network.md, section 2).
REAL_IP = "ipaddr:11.12.165.80\nnetmask:255.255.255.0\n"
REAL_NETDETECT = "netdetect address: 11.12.165.1\n"
REAL_GATEWAY = "default gateway:11.12.165.1, Iface:eth0\n"
REAL_TLS = ("dev_id:0, tls switch[0](0:disable, 1:enable), tls preconfigured[1](0:non-preset, 1:preset), "
            "tls alarm time threshold[60]days\n")
REAL_PING = ("device 3 PING 29.1.137.205\nrecv seq=0,time=1.418000ms\nrecv seq=1,time=0.034000ms\n"
             "recv seq=2,time=0.040000ms\n3 packets transmitted, 3 received, 0.00% packet loss\n")
REAL_CONF = ("address_0=29.1.137.205\nnetmask_0=255.255.0.0\nnetdetect_0=29.1.0.1\ngateway_0=29.1.0.1\n"
             "send_arp_status_0=1\n")


@pytest.mark.parametrize(("argv", "expected"), [
    (hccn.get_argv("T", 0, "ip"), ["T", "-i", "0", "-ip", "-g"]),
    (hccn.get_argv("T", 3, "netdetect"), ["T", "-i", "3", "-netdetect", "-g"]),
    (hccn.get_argv("T", 3, "gateway"), ["T", "-i", "3", "-gateway", "-g"]),
    (hccn.get_argv("T", 7, "link"), ["T", "-i", "7", "-link", "-g"]),
    (hccn.get_argv("T", 7, "net_health"), ["T", "-i", "7", "-net_health", "-g"]),
    (hccn.get_argv("T", 1, "tls"), ["T", "-i", "1", "-tls", "-g"]),
    (hccn.set_argv("T", 0, "ip", ("192.168.2.10", MASK)),
     ["T", "-i", "0", "-ip", "-s", "address", "192.168.2.10", "netmask", MASK]),
    (hccn.set_argv("T", 0, "gateway", GW), ["T", "-i", "0", "-gateway", "-s", "gateway", GW]),
    (hccn.set_argv("T", 0, "netdetect", "192.168.2.11"),
     ["T", "-i", "0", "-netdetect", "-s", "address", "192.168.2.11"]),
    (hccn.set_argv("T", 2, "tls", 0), ["T", "-i", "2", "-tls", "-s", "enable", "0"]),
    (hccn.ping_argv("T", 3, "29.1.137.205"), ["T", "-i", "3", "-ping", "-g", "address", "29.1.137.205"]),
])
def test_command_lines(argv: list, expected: list) -> None:
    assert argv == expected


@pytest.mark.parametrize(("parse", "text", "expected"), [
    (hccn.parse_ip, REAL_IP, {"address": "11.12.165.80", "netmask": "255.255.255.0"}),
    (hccn.parse_ip, "", {"address": None, "netmask": None}),
    (hccn.parse_netdetect, REAL_NETDETECT, "11.12.165.1"),
    (hccn.parse_netdetect, "", None),
    (hccn.parse_gateway, REAL_GATEWAY, "11.12.165.1"),
    (hccn.parse_gateway, "", None),
    (hccn.parse_link, "link status: UP\n", "UP"),
    (hccn.parse_link, "link status: DOWN\n", "DOWN"),
    (hccn.parse_net_health, "net health status: Success\n", "Success"),
    (hccn.parse_net_health, "net health status: Fault\n", "Fault"),
    (hccn.parse_net_health, "net health status: Init\n", "Init"),
    (hccn.parse_tls, REAL_TLS, 0),
    (hccn.parse_tls, REAL_TLS.replace("switch[0]", "switch[1]"), 1),
    (hccn.parse_tls, "", None),
])
def test_parsers_read_the_real_outputs(parse, text: str, expected) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(("rc", "text", "ok", "loss"), [
    (0, REAL_PING, True, "3 packets transmitted, 3 received, 0.00% packet loss"),
    (1, "device 0 PING 1.2.3.4\n3 packets transmitted, 0 received, 100.00% packet loss\n", False,
     "3 packets transmitted, 0 received, 100.00% packet loss"),
    (0, "device 0 PING 1.2.3.4\n3 packets transmitted, 2 received, 33.33% packet loss\n", False,
     "3 packets transmitted, 2 received, 33.33% packet loss"),
    (0, REAL_PING.replace("3 received, 0.00%", "0 received, 0.00%"), False,
     "3 packets transmitted, 0 received, 0.00% packet loss"),
    (0, "", False, None),
    (1, REAL_PING, False, "3 packets transmitted, 3 received, 0.00% packet loss"),
])
def test_a_pair_is_reachable_only_with_no_loss(rc: int, text: str, ok: bool, loss) -> None:
    parsed = hccn.parse_ping(text)
    assert hccn.ping_ok(rc, parsed) is ok and parsed["loss_line"] == loss


def test_the_real_conf_parses_and_renders_back_the_same() -> None:
    wanted = hccn.wanted_devices(["29.1.137.205"], "255.255.0.0", "29.1.0.1")
    assert hccn.render_conf(wanted) == REAL_CONF
    assert hccn.parse_conf(REAL_CONF) == {"address_0": "29.1.137.205", "netmask_0": "255.255.0.0",
                                          "netdetect_0": "29.1.0.1", "gateway_0": "29.1.0.1", "send_arp_status_0": "1"}
    assert not hccn.conf_differs(wanted, REAL_CONF)
    assert hccn.conf_differs(wanted, REAL_CONF.replace("gateway_0=29.1.0.1", "gateway_0=29.1.0.2"))


def test_render_keeps_other_lines_and_the_keys_of_other_npus() -> None:
    existing = "# site\nfoo=bar\naddress_0=1.1.1.1\naddress_5=10.0.0.5\n"
    text = hccn.render_conf(hccn.wanted_devices(["10.0.0.1"], MASK, "10.0.0.254"), existing)
    assert text.splitlines()[:5] == ["address_0=10.0.0.1", f"netmask_0={MASK}", "netdetect_0=10.0.0.254",
                                     "gateway_0=10.0.0.254", "send_arp_status_0=1"]
    assert text.splitlines()[5:] == ["# site", "foo=bar", "address_5=10.0.0.5"]


def test_keys_in_another_order_are_not_a_difference() -> None:
    wanted = hccn.wanted_devices(["29.1.137.205"], "255.255.0.0", "29.1.0.1")
    assert not hccn.conf_differs(wanted, "\n".join(reversed(REAL_CONF.splitlines())) + "\n")


ADDRESS = st.ip_addresses(v=4).map(str)


@given(st.lists(ADDRESS, min_size=1, max_size=16), ADDRESS, ADDRESS, st.one_of(st.none(), ADDRESS),
       st.text(alphabet="abcxyz_=#0123456789. \n", max_size=80))
def test_render_parse_round_trip(addresses, mask, gateway, detect, existing) -> None:
    wanted = hccn.wanted_devices(addresses, mask, gateway, detect)
    text = hccn.render_conf(wanted, existing)
    parsed = hccn.parse_conf(text)
    assert all(parsed[key] == value for key, value in hccn.conf_entries(wanted))
    assert not hccn.conf_differs(wanted, text)
    assert hccn.render_conf(wanted, text) == text  # a render of its own output is the same text


@given(ADDRESS, ADDRESS, ADDRESS, st.sampled_from([0, 1]), st.integers(0, 15))
def test_get_output_round_trip(address, mask, gateway, tls, device) -> None:
    """What the real tool prints (the formats above) reads back as the values printed."""
    assert hccn.parse_ip(f"ipaddr:{address}\nnetmask:{mask}\n") == {"address": address, "netmask": mask}
    assert hccn.parse_gateway(f"default gateway:{gateway}, Iface:eth{device}\n") == gateway
    assert hccn.parse_netdetect(f"netdetect address: {gateway}\n") == gateway
    line = REAL_TLS.replace("dev_id:0", f"dev_id:{device}").replace("switch[0]", f"switch[{tls}]")
    assert hccn.parse_tls(line) == tls


CURRENT = {0: {"address": "10.20.0.10", "netmask": MASK, "gateway": GW, "netdetect": GW, "tls": 0}}


@pytest.mark.parametrize(("current", "tls", "expected"), [
    (CURRENT, 0, []),
    (CURRENT, None, []),
    ({0: dict(CURRENT[0], tls=1)}, 0, ["NPU 0 tls: 1 -> 0"]),
    ({0: dict(CURRENT[0], tls=1)}, None, []),
    ({}, 0, ["NPU 0 ip: unset -> 10.20.0.10/255.255.255.0", "NPU 0 gateway: unset -> 10.20.0.1",
             "NPU 0 netdetect: unset -> 10.20.0.1", "NPU 0 tls: unset -> 0"]),
    ({0: dict(CURRENT[0], netmask="255.255.0.0")}, 0, ["NPU 0 ip: 10.20.0.10/255.255.0.0 -> 10.20.0.10/255.255.255.0"]),
    ({0: dict(CURRENT[0], netdetect="10.20.0.2")}, 0, ["NPU 0 netdetect: 10.20.0.2 -> 10.20.0.1"]),
])
def test_changes_are_what_differs_in_apply_order(current: dict, tls, expected: list) -> None:
    todo = hccn.changes(hccn.wanted_devices(["10.20.0.10"], MASK, GW), current, tls, "T")
    assert [hccn.describe(c) for c in todo] == expected
    assert all(c["argv"][:3] == ["T", "-i", "0"] for c in todo)


GOOD = {"id": 0, "address": "10.20.0.10", "netmask": MASK, "gateway": GW, "netdetect": GW, "link": "UP",
        "net_health": "Success", "tls": 0}


@pytest.mark.parametrize(("device", "expected"), [
    (GOOD, []),
    (dict(GOOD, link="DOWN"), ["n1 NPU 0: link DOWN, not UP"]),
    (dict(GOOD, net_health="Fault"), ["n1 NPU 0: net health Fault, not Success"]),
    (dict(GOOD, address=None), ["n1 NPU 0: address unset, not 10.20.0.10"]),
    (dict(GOOD, tls=1), ["n1 NPU 0: tls switch 1, not 0"]),
    (dict(GOOD, id=1), ["n1 NPU 0: not read (no facts for it)"]),
])
def test_verify_names_the_host_and_npu(device: dict, expected: list) -> None:
    assert hccn.verify_problems("n1", [device], hccn.wanted_devices(["10.20.0.10"], MASK, GW), 0) == expected


# ------------------------------------------------------------------- against the double


@pytest.fixture()
def lab(tmp_path):
    return FakeNodes(tmp_path)


def wanted(base: int) -> list:
    return hccn.wanted_devices([f"10.20.0.{base}", f"10.20.0.{base + 1}"], MASK, GW)


def test_configure_applies_then_is_idempotent(lab: FakeNodes, tmp_path) -> None:
    conf = tmp_path / "hccn.conf"
    run, tool = lab.runner("n1"), lab.tool("n1")
    first = hccn.configure(run, tool, wanted(10), 0, str(conf))
    assert first["changed"] and first["conf_changed"] and len(first["commands"]) == 8
    assert first["commands"][0] == f"{tool} -i 0 -ip -s address 10.20.0.10 netmask {MASK}"
    assert conf.read_text() == hccn.render_conf(wanted(10))
    second = hccn.configure(run, tool, wanted(10), 0, str(conf))
    assert (second["changed"], second["changes"], second["commands"]) == (False, [], [])
    facts = hccn.gather(run, [0, 1], tool)
    assert facts["present"] and facts["links_up"] and facts["health_ok"] and facts["tls_switches"] == [0]
    assert hccn.verify_problems("n1", facts["devices"], wanted(10), 0) == []


def test_check_mode_reports_and_changes_nothing(lab: FakeNodes, tmp_path) -> None:
    conf = tmp_path / "hccn.conf"
    before = lab.state("n1")
    result = hccn.configure(lab.runner("n1"), lab.tool("n1"), wanted(10), 0, str(conf), check_mode=True)
    assert result["changed"] and len(result["changes"]) == 8
    assert result["diff"]["before"] == "" and "address_0=10.20.0.10" in result["diff"]["after"]
    assert not conf.exists() and lab.state("n1") == before


def test_a_changed_address_is_set_again(lab: FakeNodes, tmp_path) -> None:
    conf = tmp_path / "hccn.conf"
    run, tool = lab.runner("n1"), lab.tool("n1")
    hccn.configure(run, tool, wanted(10), 0, str(conf))
    lab.run("n1", "-i", "1", "-ip", "-s", "address", "10.20.0.99", "netmask", MASK)
    again = hccn.configure(run, tool, wanted(10), 0, str(conf))
    assert again["changes"] == [f"NPU 1 ip: 10.20.0.99/{MASK} -> 10.20.0.11/{MASK}"] and not again["conf_changed"]


def test_a_failing_set_names_the_command(lab: FakeNodes, tmp_path) -> None:
    bad = hccn.wanted_devices(["10.20.0.10", "10.20.0.300"], MASK, GW)
    with pytest.raises(hccn.HccnError, match=r"-i 1 -ip -s address 10.20.0.300 .* exited 1.*NPU 1 ip"):
        hccn.configure(lab.runner("n1"), lab.tool("n1"), bad, 0, str(tmp_path / "hccn.conf"))


def test_gather_without_the_tool(tmp_path) -> None:
    facts = hccn.gather(lambda argv: (0, "", ""), [0], str(tmp_path / "absent"))
    assert facts["present"] is False and "comes with the Ascend NPU driver" in facts["error"]
    assert hccn.gather(lambda argv: (0, "", ""), [0], path_env=str(tmp_path))["present"] is False


def test_a_failed_get_reads_as_unset_with_the_error() -> None:
    dev = hccn.read_device(lambda argv: (255, "", "dcmi module initialize failed"), "T", 0)
    assert dev["address"] is None and dev["link"] is None and len(dev["errors"]) == 6
    assert dev["errors"][0] == "T -i 0 -ip -g exited 255: dcmi module initialize failed"


def test_all_pairs_name_both_nodes_both_npus_and_the_loss_line(lab: FakeNodes, tmp_path) -> None:
    for node, base in (("n1", 10), ("n2", 20)):
        hccn.configure(lab.runner(node), lab.tool(node), wanted(base), 0, str(tmp_path / f"{node}.conf"))
    targets = [{"node": "n2", "device": n, "address": f"10.20.0.{20 + n}"} for n in range(2)]
    pairs = hccn.ping_pairs("n1", [0, 1], targets)
    assert len(pairs) == 4
    assert all(p["ok"] for p in hccn.ping_all(lab.runner("n1"), lab.tool("n1"), pairs))
    lab.fault("n2", device=1, link="DOWN")
    results = hccn.ping_all(lab.runner("n1"), lab.tool("n1"), pairs, workers=1)
    failed = [hccn.describe_pair(p) for p in results if not p["ok"]]
    assert failed == [f"n1 NPU {n} -> n2 NPU 1 (10.20.0.21): 3 packets transmitted, 0 received, 100.00% packet loss"
                      for n in (0, 1)]


def test_a_ping_that_prints_no_loss_line_says_what_it_printed() -> None:
    results = hccn.ping_all(lambda argv: (2, "", "no such device"), "T",
                            hccn.ping_pairs("n1", [0], [{"node": "n2", "device": 3, "address": "1.2.3.4"}]))
    assert hccn.describe_pair(results[0]) == "n1 NPU 0 -> n2 NPU 3 (1.2.3.4): exit 2: no such device"

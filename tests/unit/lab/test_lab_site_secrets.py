"""The lab's site credentials (atlaslab/site_secrets.py): a CA, a certificate per node that a TLS client of the
lab trusts through that CA, and random secrets, private, made once; named by path in the generated inventory."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from atlaslab import config, inventory, site_secrets

GOOD = {
    "lab_name": "atlas", "bridge": "atlasbr0", "subnet": "10.77.0.0/24",
    "driver_version": "24.1.rc1", "firmware_version": "7.1.0.6.220",
    "nodes": [{"name": "n1", "groups": ["east"], "npu": {"model": "910B3", "count": 8, "hbm_mb": 65536}},
              {"name": "gw", "kind": "gateway", "groups": ["gateway"], "vars": {"gateway_branch": "east"}}],
}


@pytest.fixture()
def lab(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("ATLAS_LAB_DIR", str(tmp_path / "lab"))
    return config.parse(GOOD, tmp_path / "lab.yml")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_node_gets_a_certificate_of_the_lab_ca_naming_its_address(lab):
    site_secrets.ensure(lab)
    ca = x509.load_pem_x509_certificate(site_secrets.ca_file().read_bytes())
    for node in lab.nodes:
        cert_path, key_path = site_secrets.host_files(node.name)
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        cert.verify_directly_issued_by(ca)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert ipaddress.ip_address(node.ip) in names.get_values_for_type(x509.IPAddress)
        assert node.name in names.get_values_for_type(x509.DNSName)
        assert _mode(key_path) == 0o600 and _mode(key_path.parent) == 0o700
    assert not site_secrets.ca_key_file().is_relative_to(site_secrets.site_dir()), "a controller never gets the CA key"


def test_secrets_are_random_private_and_made_once(lab):
    site_secrets.ensure(lab)
    first = {name: site_secrets.secret(name) for name in site_secrets.SECRETS}
    assert len(set(first.values())) == len(first) and all(len(v) >= 32 for v in first.values())
    assert all(_mode(site_secrets.secrets_dir() / name) == 0o600 for name in first)
    cert = site_secrets.host_files("n1")[0].read_bytes()
    site_secrets.ensure(lab)
    assert {name: site_secrets.secret(name) for name in first} == first
    assert site_secrets.host_files("n1")[0].read_bytes() == cert


def test_a_new_ca_brings_new_certificates(lab):
    site_secrets.ensure(lab)
    site_secrets.ca_key_file().unlink()
    site_secrets.ensure(lab)
    ca = x509.load_pem_x509_certificate(site_secrets.ca_file().read_bytes())
    x509.load_pem_x509_certificate(site_secrets.host_files("n1")[0].read_bytes()).verify_directly_issued_by(ca)


def test_the_inventory_names_the_files_never_their_content(lab):
    site_secrets.ensure(lab)
    text = inventory.render(lab, Path("/k"), Path("/kh"), site_secrets.group_vars(lab), site_secrets.host_vars)
    data = yaml.safe_load(text)["all"]
    assert data["vars"]["atlas_tls_ca_file"] == str(site_secrets.ca_file())
    assert data["vars"]["atlas_lab_host"] == "10.77.0.1"
    assert data["children"]["atlas_nodes"]["hosts"]["n1"]["atlas_tls_key_file"] == str(site_secrets.host_files("n1")[1])
    assert data["children"]["gateway"]["hosts"]["gw"]["atlas_tls_cert_file"] == str(site_secrets.host_files("gw")[0])
    for name in site_secrets.SECRETS:
        assert site_secrets.secret(name) not in text
    assert "PRIVATE KEY" not in text

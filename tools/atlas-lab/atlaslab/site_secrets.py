"""The lab's site credentials: a lab certificate authority, a certificate per node, and the secrets a
site keeps on its controller (the engines' API key, the monitoring passwords).

A bank brings these from its own PKI and vault (docs/security.md); the lab makes its own, once per lab,
under ``<lab dir>/site/`` (0700, files 0600), and names them in the generated inventory by path:
``atlas_tls_ca_file`` for every host, ``atlas_tls_cert_file``/``atlas_tls_key_file`` per host, and
``atlas_lab_secrets_dir`` (read by ``inventory/lab/group_vars/all.yml`` with the ``file`` lookup). The
lab's controller node gets the same files at the same paths (tests/lab/labtools.py carries them).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import shutil
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from atlaslab import paths
from atlaslab.config import LabConfig, NodeSpec

CA_NAME = "atlas-serving lab CA (lab only, not for production)"
# Secret files of the lab's controller, each one random token (docs/security.md, "Credentials").
SECRETS = ("serving-api-key", "monitoring-scrape-password", "monitoring-api-password")
_VALID = datetime.timedelta(days=825)


def site_dir() -> Path:
    return paths.lab_dir() / "site"


def ca_file() -> Path:
    return site_dir() / "ca.pem"


def secrets_dir() -> Path:
    return site_dir() / "secrets"


def secret(name: str) -> str:
    """One of SECRETS, as the lab's inventory reads it."""
    return (secrets_dir() / name).read_text().strip()


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    tmp.replace(path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "atlas-serving lab"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def ca_key_file() -> Path:
    """The CA's key: beside the site's files, not among them (a controller gets the site's files, never this)."""
    return paths.lab_dir() / "site-ca" / "ca.key"


def _ca() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key_path = ca_key_file()
    if key_path.is_file() and ca_file().is_file():
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        return key, x509.load_pem_x509_certificate(ca_file().read_bytes())
    _private_dir(key_path.parent)
    shutil.rmtree(site_dir() / "hosts", ignore_errors=True)  # certificates of another CA
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(CA_NAME)).issuer_name(_name(CA_NAME))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    _write_private(key_path, _key_pem(key))
    _write_private(ca_file(), cert.public_bytes(serialization.Encoding.PEM))
    return key, cert


def host_files(name: str) -> tuple[Path, Path]:
    """(certificate, key) of a lab node."""
    return site_dir() / "hosts" / f"{name}.pem", site_dir() / "hosts" / f"{name}.key"


def _host_cert(node: NodeSpec, ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate) -> None:
    cert_path, key_path = host_files(node.name)
    if cert_path.is_file() and key_path.is_file():
        return
    _private_dir(cert_path.parent)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(node.name)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALID)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(node.name),
                                                        x509.IPAddress(ipaddress.ip_address(node.ip))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write_private(key_path, _key_pem(key))
    _write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))


def ensure(cfg: LabConfig) -> None:
    """The CA, every node's certificate and the secrets, each made once."""
    _private_dir(site_dir())
    ca_key, ca = _ca()
    for node in cfg.nodes:
        _host_cert(node, ca_key, ca)
    _private_dir(secrets_dir())
    for name in SECRETS:
        path = secrets_dir() / name
        if not path.is_file():
            _write_private(path, (secrets.token_urlsafe(32) + "\n").encode())


def group_vars(cfg: LabConfig) -> dict[str, str]:
    """What every host of the lab's inventory gets: the CA, where the secrets are, and the lab host's own
    addresses (the machine the lab runs on: its tests and drills act as a controller and as clients; the lab's
    own tools connect from the harness address)."""
    return {"atlas_tls_ca_file": str(ca_file()), "atlas_lab_secrets_dir": str(secrets_dir()),
            "atlas_lab_host": cfg.controller_ip, "atlas_lab_harness": cfg.harness_ip,
            "monitoring_scrape_password_file": str(secrets_dir() / "monitoring-scrape-password"),
            "monitoring_api_password_file": str(secrets_dir() / "monitoring-api-password")}


def host_vars(name: str) -> dict[str, str]:
    cert, key = host_files(name)
    return {"atlas_tls_cert_file": str(cert), "atlas_tls_key_file": str(key)}


def files() -> list[Path]:
    """Every file a controller of the lab needs (the lab's controller node gets copies)."""
    return sorted(p for p in site_dir().rglob("*") if p.is_file() and not p.name.startswith("."))

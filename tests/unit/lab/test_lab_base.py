"""Base root filesystem recipe: cache key, mirror detection, cleanup of host leftovers; network rules text."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atlaslab import base, net


def test_hash_covers_packages_and_recipe() -> None:
    assert base.base_hash() == base.base_hash()
    every = base.PACKAGES + base.LATE_PACKAGES
    assert base.base_hash(every + ("vim",)) != base.base_hash()
    assert base.base_hash(base.PACKAGES) != base.base_hash(), "the packages installed after debootstrap count"
    assert base.base_hash(recipe_version=base.RECIPE_VERSION + 1) != base.base_hash()
    assert base.base_hash(tuple(reversed(every))) == base.base_hash()


def test_cache_path_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path))
    assert base.tarball_path("abc") == tmp_path / "base-abc.tar.zst"


def test_required_packages_are_in_the_list() -> None:
    for pkg in ("systemd", "openssh-server", "python3-venv", "nginx-light", "libnuma1", "rsync"):
        assert pkg in base.PACKAGES


def test_mirror_from_deb822_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATLAS_DEBIAN_MIRROR", raising=False)
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert base.host_mirror(tmp_path) == "http://mirror.example/debian"


def test_mirror_from_legacy_list_and_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATLAS_DEBIAN_MIRROR", raising=False)
    (tmp_path / "sources.list.d").mkdir()
    assert base.host_mirror(tmp_path) == base.DEFAULT_MIRROR
    (tmp_path / "sources.list").write_text("deb [arch=amd64] http://legacy.example/debian bookworm main\n")
    assert base.host_mirror(tmp_path) == "http://legacy.example/debian"
    monkeypatch.setenv("ATLAS_DEBIAN_MIRROR", "http://override/debian")
    assert base.host_mirror(tmp_path) == "http://override/debian"


def test_clean_rootfs_removes_host_identity(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "ssh").mkdir(parents=True)
    (etc / "systemd/system/multi-user.target.wants").mkdir(parents=True)
    (tmp_path / "root").mkdir()
    (etc / "hostname").write_text("buildhost\n")
    (etc / "machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    (etc / "hosts").write_text("192.0.2.2 buildhost\n")
    (etc / "resolv.conf").write_text("nameserver 192.0.2.1\n")
    (etc / "ssh/ssh_host_rsa_key").write_text("secret")
    dangling = etc / "systemd/system/multi-user.target.wants/nginx.service"
    dangling.symlink_to("/nonexistent/nginx.service")
    base.clean_rootfs(tmp_path)
    assert not (etc / "hostname").exists()
    assert (etc / "machine-id").read_text() == ""
    assert "buildhost" not in (etc / "hosts").read_text()
    assert "nameserver" not in (etc / "resolv.conf").read_text()
    assert not list((etc / "ssh").glob("ssh_host_*"))
    assert "HostKey /etc/ssh/ssh_host_ed25519_key" in (etc / "ssh/sshd_config.d/atlas-lab.conf").read_text()
    assert not os.path.lexists(dangling)
    for unit in base.MASKED_UNITS:
        assert os.readlink(etc / "systemd/system" / unit) == "/dev/null"


def test_nft_ruleset_drops_forwarding_off_the_bridge_and_has_no_nat() -> None:
    text = net.nft_ruleset("atlasbr0", "10.77.0.0/24")
    assert f"table inet {net.NFT_TABLE} {{" in text
    assert 'iifname "atlasbr0" counter drop' in text and 'oifname "atlasbr0" counter drop' in text
    assert "hook forward" in text
    assert "nat" not in text.lower() and "masquerade" not in text


def test_nft_ruleset_refuses_direct_ssh_from_the_controller_to_nodes_behind_a_jump_host() -> None:
    text = net.nft_ruleset("atlasbr0", "10.77.0.0/24", "10.77.0.1", ("10.77.0.13", "10.77.0.16"))
    assert "hook output" in text
    assert "ip saddr 10.77.0.1 ip daddr { 10.77.0.13, 10.77.0.16 } tcp dport 22 counter reject" in text
    assert "hook output" not in net.nft_ruleset("atlasbr0", "10.77.0.0/24", "10.77.0.1", ())

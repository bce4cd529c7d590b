"""The CANN installer test doubles, run for real: build, check, install, upgrade, uninstall."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from atlaslab.doubles.cann_run import (
    CannBuildError,
    build_cann_packages,
    package_files,
    version_key,
)


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "ATLAS_CANN_SYSROOT": str(tmp_path / "sysroot"), "TMPDIR": str(tmp_path)}


def run(pkg: Path, *args: str, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(pkg), *args], env=env, input=stdin or "", capture_output=True, text=True, timeout=60
    )


def install(pkg: Path, root: Path, env: dict[str, str], op: str = "--install") -> subprocess.CompletedProcess:
    """Install ``pkg`` as Huawei's images do: NNAL with the toolkit's set_env.sh sourced (its check_owner)."""
    args = ["--nox11", op, f"--install-path={root}", "--quiet", "--install-for-all"]
    if "nnal" not in pkg.name:
        return run(pkg, *args, env=env)
    argv = ["bash", "-c", '. "$1" && shift && exec "$@"', "nnal", str(root / "ascend-toolkit/set_env.sh"),
            "bash", str(pkg), *args]
    return subprocess.run(argv, env=env, input="", capture_output=True, text=True, timeout=60)


def read_info(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def read_nnal_info(path: Path) -> dict[str, str]:
    """NNAL's version.info: indented ``Key : Value`` lines."""
    lines = path.read_text().splitlines()
    return {key.strip(): value.strip() for key, _, value in (line.partition(" : ") for line in lines)}


def latest_toolkit(root: Path) -> str:
    """The toolkit version ascend-toolkit/latest names (a real directory before 8.5)."""
    return read_info(root / "ascend-toolkit/latest/x86_64-linux/ascend_toolkit_install.info")["version"]


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    out = tmp_path_factory.mktemp("cann")
    return {v: build_cann_packages(out, v) for v in ("7.0.RC1", "8.2.RC1", "8.3.RC1", "8.5.0")}


@pytest.mark.parametrize(
    ("version", "names"),
    [
        ("7.0.RC1", ["Ascend-cann-toolkit_7.0.RC1_linux-x86_64.run", "Ascend-cann-kernels-910b_7.0.RC1_linux.zip"]),
        (
            "8.0.RC2",
            [
                "Ascend-cann-toolkit_8.0.RC2_linux-x86_64.run",
                "Ascend-cann-kernels-910b_8.0.RC2_linux.run",
                "Ascend-cann-nnal_8.0.RC2_linux-x86_64.run",
            ],
        ),
        (
            "8.3.RC1",
            [
                "Ascend-cann-toolkit_8.3.RC1_linux-x86_64.run",
                "Ascend-cann-kernels-910b_8.3.RC1_linux-x86_64.run",
                "Ascend-cann-nnal_8.3.RC1_linux-x86_64.run",
            ],
        ),
        (
            "8.5.0",
            [
                "Ascend-cann-toolkit_8.5.0_linux-x86_64.run",
                "Ascend-cann-910b-ops_8.5.0_linux-x86_64.run",
                "Ascend-cann-nnal_8.5.0_linux-x86_64.run",
            ],
        ),
    ],
)
def test_package_file_names(version: str, names: list[str]) -> None:
    assert [spec.file_name for spec in package_files(version)] == names


def test_version_order() -> None:
    ordered = ["7.0.RC1", "7.0.0", "7.0.1.1", "8.0.RC3", "8.0.0", "8.3.RC1", "8.3.RC2", "8.5.0", "9.1.0"]
    assert sorted(ordered, key=version_key) == ordered
    assert sorted(reversed(ordered), key=version_key) == ordered


@pytest.mark.parametrize("bad", ["8.3", "v8.3.RC1", "8.3.rc1", ""])
def test_bad_version_is_refused_with_the_form(bad: str) -> None:
    with pytest.raises(CannBuildError, match="RC<n>"):
        package_files(bad)


def test_bad_arch_is_refused() -> None:
    with pytest.raises(CannBuildError, match="aarch64"):
        package_files("8.3.RC1", arch="ppc64le")


def test_build_is_reproducible(tmp_path: Path) -> None:
    first = [p.read_bytes() for p in build_cann_packages(tmp_path / "a", "8.3.RC1")]
    second = [p.read_bytes() for p in build_cann_packages(tmp_path / "b", "8.3.RC1")]
    assert first == second


def test_info_check_list_help(packages: dict[str, list[Path]], env: dict[str, str]) -> None:
    toolkit = packages["8.3.RC1"][0]
    info = run(toolkit, "--info", env=env)
    assert info.returncode == 0
    assert "Identification: Ascend-cann-toolkit 8.3.RC1" in info.stdout
    check = run(toolkit, "--check", env=env)
    assert check.returncode == 0, check.stderr
    assert "SHA256 checksums are OK" in check.stderr
    listing = run(toolkit, "--list", env=env)
    assert "./install.sh" in listing.stdout and "./files/lib64/libascendcl.so" in listing.stdout
    usage = run(toolkit, "--help", env=env)
    assert usage.returncode == 0 and "--install-path=<dir>" in usage.stdout


def test_flipped_byte_is_refused_by_check_and_install(
    packages: dict[str, list[Path]], env: dict[str, str], tmp_path: Path
) -> None:
    data = bytearray(packages["8.3.RC1"][0].read_bytes())
    data[-100] ^= 0x01
    broken = tmp_path / "broken.run"
    broken.write_bytes(bytes(data))
    check = run(broken, "--check", env=env)
    assert check.returncode == 2
    assert "Error in SHA256 checksums" in check.stderr
    inst = install(broken, tmp_path / "Ascend", env)
    assert inst.returncode == 2
    assert not (tmp_path / "Ascend").exists()


def test_truncated_file_is_refused(packages: dict[str, list[Path]], env: dict[str, str], tmp_path: Path) -> None:
    short = tmp_path / "short.run"
    short.write_bytes(packages["8.3.RC1"][0].read_bytes()[:-10])
    assert run(short, "--check", env=env).returncode == 2


def test_eula_is_refused_without_quiet(packages: dict[str, list[Path]], env: dict[str, str], tmp_path: Path) -> None:
    root = tmp_path / "Ascend"
    result = run(packages["8.3.RC1"][0], "--install", f"--install-path={root}", env=env)
    assert result.returncode == 1
    assert "EULA" in result.stdout + result.stderr
    assert not (root / "ascend-toolkit").exists()
    answered_no = run(packages["8.3.RC1"][0], "--install", f"--install-path={root}", env=env, stdin="n\n")
    assert answered_no.returncode == 1
    answered_yes = run(packages["8.3.RC1"][0], "--install", f"--install-path={root}", env=env, stdin="y\n")
    assert answered_yes.returncode == 0, answered_yes.stderr


def test_install_pre_85_layout(packages: dict[str, list[Path]], env: dict[str, str], tmp_path: Path) -> None:
    root = tmp_path / "Ascend"
    for pkg in packages["8.3.RC1"]:
        result = install(pkg, root, env)
        assert result.returncode == 0, result.stdout + result.stderr
    toolkit = root / "ascend-toolkit"
    latest = toolkit / "latest"
    assert latest.is_dir() and not latest.is_symlink() and (latest / "version.cfg").is_file()
    assert os.readlink(latest / "opp_kernel") == "../8.3.RC1/opp_kernel"
    info = read_info(latest / "x86_64-linux/ascend_toolkit_install.info")
    assert info["package_name"] == "Ascend-cann-toolkit"
    assert info["version"] == "8.3.RC1"
    assert info["arch"] == "x86_64" and info["os"] == "linux"
    kernels = read_info(toolkit / "8.3.RC1/opp_kernel/version.info")
    assert kernels["version_dir"] == "8.3.RC1" and kernels["Version"] != "8.3.RC1"  # Version= is the build
    assert (toolkit / "8.3.RC1/opp_kernel/script/uninstall.sh").is_file()
    assert (toolkit / "8.3.RC1/opp/built-in/op_impl/ai_core/tbe/kernel/ascend910b").is_dir()
    assert read_nnal_info(root / "nnal/atb/latest/version.info")["Ascend-cann-atb"] == "8.3.RC1"
    assert (root / "nnal/atb/8.3.RC1/scripts/uninstall.sh").is_file()
    log = Path(env["ATLAS_CANN_SYSROOT"]) / "var/log/ascend_seclog/ascend_toolkit_install.log"
    assert "install success" in log.read_text()


def sourced(script: Path, *names: str) -> dict[str, str]:
    shown = "; ".join(f'echo "{n}=${{{n}}}"' for n in names)
    out = subprocess.run(
        ["bash", "-c", f". {script}; {shown}"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_set_env_exports_the_real_variables(
    packages: dict[str, list[Path]], env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "Ascend"
    for pkg in packages["8.3.RC1"]:
        assert install(pkg, root, env).returncode == 0
    names = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH", "ASCEND_OPP_PATH", "LD_LIBRARY_PATH", "PATH", "PYTHONPATH")
    values = sourced(root / "ascend-toolkit/set_env.sh", *names)
    home = f"{root}/ascend-toolkit/latest"
    assert values["ASCEND_TOOLKIT_HOME"] == home and values["ASCEND_HOME_PATH"] == home
    assert values["ASCEND_OPP_PATH"] == f"{home}/opp"
    assert f"{home}/lib64" in values["LD_LIBRARY_PATH"].split(":")
    assert f"{home}/bin" in values["PATH"].split(":")
    assert f"{home}/python/site-packages" in values["PYTHONPATH"].split(":")
    atb = sourced(root / "nnal/atb/set_env.sh", "ATB_HOME_PATH")
    assert atb["ATB_HOME_PATH"] == f"{root}/nnal/atb/latest/atb/cxx_abi_1"


def test_install_85_layout(packages: dict[str, list[Path]], env: dict[str, str], tmp_path: Path) -> None:
    root = tmp_path / "Ascend"
    for pkg in packages["8.5.0"]:
        result = install(pkg, root, env)
        assert result.returncode == 0, result.stdout + result.stderr
    assert os.readlink(root / "cann") == "cann-8.5.0"
    assert read_info(root / "cann/x86_64-linux/ascend_toolkit_install.info")["version"] == "8.5.0"
    assert os.readlink(root / "ascend-toolkit/latest") == str(root / "cann")
    ops = read_info(root / "cann/x86_64-linux/ascend_ops_install.info")
    assert (ops["package_name"], ops["version"]) == ("Ascend-cann-910b-ops", "8.5.0")
    assert (root / "cann-8.5.0/x86_64-linux/script/ops_uninstall.sh").is_file()
    assert not (root / "cann-8.5.0/opp_kernel").exists()
    assert (root / "nnal/nnal_uninstall.sh").is_file()
    home = sourced(root / "ascend-toolkit/set_env.sh", "ASCEND_HOME_PATH")["ASCEND_HOME_PATH"]
    assert home == f"{root}/cann-8.5.0"  # what Huawei's 8.5+ images set: the version's own directory
    assert sourced(root / "cann/set_env.sh", "ASCEND_OPP_PATH")["ASCEND_OPP_PATH"] == f"{root}/cann-8.5.0/opp"


def test_kernels_and_nnal_need_the_same_toolkit(
    packages: dict[str, list[Path]], env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "Ascend"
    kernels, nnal = packages["8.3.RC1"][1:]
    alone = install(kernels, root, env)
    assert alone.returncode == 1 and "Install Ascend-cann-toolkit_8.3.RC1 first" in alone.stderr
    assert install(packages["8.2.RC1"][0], root, env).returncode == 0
    mismatch = install(nnal, root, env)
    assert mismatch.returncode == 1 and "8.2.RC1 is installed" in mismatch.stderr


def test_upgrade_then_downgrade_refused_then_uninstall(
    packages: dict[str, list[Path]], env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "Ascend"
    old, new = packages["8.2.RC1"][0], packages["8.3.RC1"][0]
    assert install(old, root, env).returncode == 0
    up = install(new, root, env, "--upgrade")
    assert up.returncode == 0, up.stderr
    assert read_info(root / "ascend-toolkit/latest/x86_64-linux/ascend_toolkit_install.info")["version"] == "8.3.RC1"
    assert not (root / "ascend-toolkit/8.2.RC1").exists()
    down = install(old, root, env, "--upgrade")
    assert down.returncode == 1 and "does not downgrade" in down.stderr
    wrong = run(old, "--uninstall", f"--install-path={root}", env=env)
    assert wrong.returncode == 1 and "8.2.RC1 is not installed" in wrong.stderr
    gone = run(new, "--uninstall", f"--install-path={root}", env=env)
    assert gone.returncode == 0, gone.stderr
    assert not (root / "ascend-toolkit").exists()
    assert install(old, root, env).returncode == 0


def test_versions_of_one_layout_live_side_by_side(
    packages: dict[str, list[Path]], env: dict[str, str], tmp_path: Path
) -> None:
    """--install of another version keeps the installed one (CANN's multi-version installation): each version
    has its own directory and its own environment script, `latest` names the last installed, and removing a
    version leaves the other whole."""
    root = tmp_path / "Ascend"
    for version in ("8.2.RC1", "8.3.RC1"):
        for pkg in packages[version]:
            result = install(pkg, root, env)
            assert result.returncode == 0, result.stdout + result.stderr
    assert latest_toolkit(root) == "8.3.RC1"
    for version in ("8.2.RC1", "8.3.RC1"):
        vdir = root / "ascend-toolkit" / version
        assert read_info(vdir / "opp_kernel/version.info")["version_dir"] == version
        assert sourced(vdir / "bin/setenv.bash", "ASCEND_HOME_PATH")["ASCEND_HOME_PATH"] == str(vdir)
        atb = root / "nnal/atb" / version / "atb"
        assert sourced(atb / "set_env.sh", "ATB_HOME_PATH")["ATB_HOME_PATH"] == f"{atb}/cxx_abi_1"
    assert os.readlink(root / "nnal/atb/latest") == "8.3.RC1"
    gone = subprocess.run(["bash", str(root / "ascend-toolkit/8.2.RC1/x86_64-linux/script/uninstall.sh"), "--quiet"],
                          env=env, capture_output=True, text=True)
    assert gone.returncode == 0, gone.stderr
    assert not (root / "ascend-toolkit/8.2.RC1").exists()
    assert (root / "ascend-toolkit/8.3.RC1/bin/setenv.bash").is_file()
    assert latest_toolkit(root) == "8.3.RC1"
    # the last installed removed: `latest` falls back to the newest left
    assert install(packages["8.2.RC1"][0], root, env).returncode == 0
    assert latest_toolkit(root) == "8.2.RC1"
    assert run(packages["8.2.RC1"][0], "--uninstall", f"--install-path={root}", env=env).returncode == 0
    assert latest_toolkit(root) == "8.3.RC1"


def test_the_two_layouts_never_live_side_by_side(
    packages: dict[str, list[Path]], env: dict[str, str], tmp_path: Path
) -> None:
    """Moving from an earlier CANN to 8.5 takes --upgrade or uninstalling the earlier versions (CANN 8.5.0's
    installation guide); going back from 8.5 takes --uninstall, then --install (its release notes)."""
    root = tmp_path / "Ascend"
    assert install(packages["8.3.RC1"][0], root, env).returncode == 0
    beside = install(packages["8.5.0"][0], root, env)
    assert beside.returncode == 1 and "takes --upgrade, or uninstalling every earlier version" in beside.stderr
    assert not (root / "cann-8.5.0").exists()
    assert install(packages["8.5.0"][0], root, env, "--upgrade").returncode == 0
    back = install(packages["8.3.RC1"][0], root, env)
    assert back.returncode == 1 and "takes --uninstall of it first, then --install" in back.stderr


def test_upgrade_across_85_and_back_with_the_recorded_uninstaller(
    packages: dict[str, list[Path]], env: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "Ascend"
    assert install(packages["8.3.RC1"][0], root, env).returncode == 0
    assert install(packages["8.5.0"][0], root, env, "--upgrade").returncode == 0
    assert not (root / "ascend-toolkit/8.3.RC1").exists()
    assert (root / "ascend-toolkit/set_env.sh").is_file()
    uninstaller = root / "cann/x86_64-linux/script/uninstall.sh"
    result = subprocess.run(["bash", str(uninstaller), "--quiet"], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert not (root / "cann").exists() and not (root / "cann-8.5.0").exists()
    assert not (root / "ascend-toolkit").exists()


def test_noexec_extract(packages: dict[str, list[Path]], env: dict[str, str], tmp_path: Path) -> None:
    target = tmp_path / "x"
    result = run(packages["8.3.RC1"][2], "--noexec", f"--extract={target}", env=env)
    assert result.returncode == 0, result.stderr
    assert (target / "install.sh").is_file() and (target / "files/atb/cxx_abi_1/lib/libatb.so").is_file()
    assert run(packages["8.3.RC1"][2], "--noexec", env=env).returncode == 1


def test_bad_options(packages: dict[str, list[Path]], env: dict[str, str], tmp_path: Path) -> None:
    toolkit = packages["8.3.RC1"][0]
    unknown = run(toolkit, "--instal", "--quiet", env=env)
    assert unknown.returncode == 1 and "Unrecognized parameter: --instal" in unknown.stderr
    both = run(toolkit, "--install", "--uninstall", env=env)
    assert both.returncode == 1 and "cannot be used together" in both.stderr
    relative = run(toolkit, "--install", "--quiet", "--install-path=rel/dir", env=env)
    assert relative.returncode == 1 and "not absolute" in relative.stderr


def test_70rc1_kernels_zip_holds_the_run(packages: dict[str, list[Path]], tmp_path: Path) -> None:
    import zipfile

    with zipfile.ZipFile(packages["7.0.RC1"][1]) as archive:
        assert archive.namelist() == ["Ascend-cann-kernels-910b_7.0.RC1_linux.run"]


def test_the_parameter_tables_rules(packages: dict[str, list[Path]], env: dict[str, str], tmp_path: Path) -> None:
    """What Huawei's parameter table says of the options (CANN 8.3.RC1 and 8.0.RC3 "参数说明"), refused with exit 1
    and nothing installed: --quiet and --install-for-all only with an installation, --full for the toolkit only,
    --devel for the toolkit and kernels only."""
    root = tmp_path / "Ascend"
    toolkit, kernels, nnal = packages["8.3.RC1"]
    cases = [
        (toolkit, ["--uninstall", "--quiet"], "--quiet is used with --install or --upgrade"),
        (toolkit, ["--uninstall", "--install-for-all"], "--install-for-all is used with --install"),
        (kernels, ["--full", "--quiet"], "--full is supported by the toolkit package only"),
        (nnal, ["--devel", "--quiet"], "--devel is supported by the toolkit and kernels packages only"),
    ]
    for pkg, args, message in cases:
        refused = run(pkg, "--nox11", *args, f"--install-path={root}", env=env)
        assert refused.returncode == 1 and message in refused.stderr, (args, refused.stderr)
    assert not root.exists()


def test_the_install_path_and_the_global_record(packages: dict[str, list[Path]], env: dict[str, str],
                                                tmp_path: Path) -> None:
    """Before 8.2 the path given must be the one /etc/Ascend/ascend_cann_install.info records (8.0.RC3's table);
    from 8.2 another path resets the record (8.3.RC1's)."""
    first, other = tmp_path / "Ascend", tmp_path / "Other"
    assert install(packages["7.0.RC1"][0], first, env).returncode == 0
    elsewhere = install(packages["7.0.RC1"][0], other, env)
    assert elsewhere.returncode == 1 and f"not the one in {env['ATLAS_CANN_SYSROOT']}" in elsewhere.stderr
    assert not other.exists()
    assert install(packages["8.2.RC1"][0], other, env).returncode == 0
    record = Path(env["ATLAS_CANN_SYSROOT"]) / "etc/Ascend/ascend_cann_install.info"
    assert read_info(record)["Install_Path"] == str(other)


@pytest.mark.parametrize(("environment", "message"), [
    ({}, "Check owner failed, please check env ASCEND_TOOLKIT_HOME or ASCEND_NNAE_HOME is set."),
    ({"ASCEND_TOOLKIT_HOME": "{root}/ascend-toolkit/latest"},
     "Check owner failed, please check env ASCEND_HOME_PATH is set."),
    ({"ASCEND_TOOLKIT_HOME": "{root}/x", "ASCEND_HOME_PATH": "{root}/x"},
     "Check owner failed, can not find cann in {root}/x."),
    ({"ASCEND_TOOLKIT_HOME": "{root}/other", "ASCEND_HOME_PATH": "{root}/other"},
     "Check owner failed, current owner is not same with CANN."),
])
def test_nnal_needs_the_toolkit_environment(packages: dict[str, list[Path]], env: dict[str, str], tmp_path: Path,
                                            environment: dict[str, str], message: str) -> None:
    """ATB's check_owner (hicann/ascend-transformer-boost scripts/install.sh): NNAL's --install stops with exit 1
    unless the toolkit's set_env.sh was sourced and $ASCEND_HOME_PATH is a directory owned by the caller."""
    root = tmp_path / "Ascend"
    assert install(packages["8.3.RC1"][0], root, env).returncode == 0
    (root / "other").mkdir()
    os.chown(root / "other", 65534, 65534)
    clean = {k: v for k, v in env.items() if not k.startswith(("ASCEND_TOOLKIT", "ASCEND_HOME", "ASCEND_NNAE"))}
    clean |= {key: value.format(root=root) for key, value in environment.items()}
    refused = run(packages["8.3.RC1"][2], "--install", f"--install-path={root}", "--quiet", env=clean)
    assert refused.returncode == 1
    assert "[cann-atb] " in refused.stdout and f"[ERROR] {message.format(root=root)}" in refused.stdout
    assert not (root / "nnal").exists()
    sourced_env = clean | {"ASCEND_TOOLKIT_HOME": str(root / "ascend-toolkit/latest"),
                           "ASCEND_HOME_PATH": str(root / "ascend-toolkit/latest")}
    relative = run(packages["8.3.RC1"][2], "--install", "--install-path=rel/dir", "--quiet", env=sourced_env)
    assert relative.returncode == 1
    assert "[ERROR] Install failed, [ERROR] use absolute path for --install-path argument" in relative.stdout

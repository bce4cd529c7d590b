#!/bin/bash
# Install logic of an atlas lab HDK test-double package (NPU driver or firmware).
# Reads package.info next to this script. Runtime: bash and coreutils.
#
# What it does like Huawei's packages (hicann/driver scripts/package/custom/driver/common/scripts/{install.sh,
# args_parse.sh,env_check.sh,driver_install.sh} @ ef377e95, "V4" in docs/ascend-platform.md):
# - output lines "[Driver] [<date>] [INFO]<message>" ([Firmware] for the firmware) on stdout and in
#   /var/log/ascend_seclog/ascend_install.log, errors "[ERROR]ERR_NO:0x....;ERR_DES:<text>" with the vendor's codes:
#   0x0004 option combinations, 0x0003 install path, 0x0091 account, 0x0093 not root, 0x0095 an overwrite install
#   whose --install-username/--install-usergroup differ from UserName/UserGroup in /etc/ascend_install.info,
#   0x0080 nothing to uninstall; the real one colours some lines with ANSI escapes, this one prints them plain;
# - the driver's options and their rules (the option loop and unsupportParam): one of --full/--run/--upgrade, or
#   --uninstall alone (or with --force); --install-path=, --install-username= and --install-usergroup= only with
#   --full/--run (an upgrade keeps the path and account of the installation it upgrades), the account named as a
#   pair, root only with --install-for-all; each refusal exit 1;
# - --upgrade to an older version is performed, as the vendor's scripts do (no "older refused" rule);
# - the firmware takes the options ascend-deployer gives it (--full, --upgrade, --quiet; the makeself header takes
#   --nox11; its real options are not published) and needs an installed driver (first install: driver, then
#   firmware); it installs where the driver's record says;
# - records: <path>/driver/version.info with the vendor's keys in the vendor's order (Version and package_version
#   equal), <path>/firmware/version.info (Version=<firmware build>, firmware_version=1.0, package_version=<HDK
#   release>, compatible_version_drv=[...]), /etc/ascend_install.info (UserName, UserGroup, Driver_Install_Type,
#   Driver_Install_Path_Param, Driver_Install_For_All, Driver_Install_Mode; Firmware_Install_Type,
#   Firmware_Install_Path_Param) with Driver_Install_Status=complete appended after a successful driver install; an
#   uninstaller at <path>/driver/script/uninstall.sh. The vendor makes driver files immutable (chattr +i); this
#   double does not (a container may lack CAP_LINUX_IMMUTABLE, and an immutable file outlives a test's cleanup);
# - exit status 0 installed and running, 1 failure (nothing written), 2 installed but running only after a reboot:
#   a first driver install (no driver installed before, none loaded, no --force) whose chips do not all come up
#   ("There are some chips not ready, please check after reboot"; the vendor polls upgrade-tool --boot_status about
#   60 s for boot status 16 on every chip), a hot reset that fails while a process holds a /dev/davinciN (the
#   vendor's device_hot_reset.sh), --force, and any new firmware (activated at the next boot). An uninstall exits 0
#   and says a reboot is needed, as the vendor's does.
#
# Lab hooks (files, so that an installer run over SSH sees them; under ATLAS_HDK_SYSROOT in unit tests):
# - /etc/atlas-lab/chips-ready: present, a first driver install finds every chip up (boot status 16): the driver is
#   loaded at once, exit 0. Absent (default), a first install exits 2 and the driver runs after the next boot.
# - /etc/atlas-lab/fail-install: one package kind a line (driver, firmware); that kind's installer fails, exit 1,
#   after its argument checks and before it writes anything.
# - The node's simulated NPU layer (/usr/local/sbin/atlas-lab-driver; ATLAS_LAB_DRIVER) says which driver and
#   firmware run, loads a driver and tries the hot reset; anything else takes effect at the next boot (the node's
#   atlas-lab-npu-boot unit runs `atlas-lab-driver load`).
SELF_DIR=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$SELF_DIR/package.info" || { echo "[ERROR] package.info missing in $SELF_DIR"; exit 1; }

# Lab-only hooks (unit tests): ATLAS_HDK_SYSROOT prefixes /etc, /var/log and the default install
# path; ATLAS_LAB_DRIVER names the running-version helper.
SYSROOT="${ATLAS_HDK_SYSROOT:-}"
LAB_DRIVER="${ATLAS_LAB_DRIVER:-/usr/local/sbin/atlas-lab-driver}"
LAB_ETC="$SYSROOT/etc/atlas-lab"
LOG_DIR="$SYSROOT/var/log/ascend_seclog"
LOG_FILE="$LOG_DIR/ascend_install.log"
EXIT_REBOOT=2

# shellcheck source=/dev/null
. "$SELF_DIR/common.sh" || { echo "[ERROR] common.sh missing in $SELF_DIR"; exit 1; }

# --- output: the vendor's drvEcho/log lines (these replace common.sh's log and die) ----------------------------
log_only() {  # log_only LEVEL MESSAGE: the line in the log file only
    if mkdir -p "$LOG_DIR" 2>/dev/null; then
        chmod 750 "$LOG_DIR" 2>/dev/null
        echo "[$LOG_TAG] [$(date '+%Y-%m-%d %H:%M:%S')] [$1]$2" >> "$LOG_FILE" 2>/dev/null \
            && chmod 640 "$LOG_FILE" 2>/dev/null
    fi
    return 0
}

log() {  # log LEVEL MESSAGE: the line on stdout and in the log file
    local level="$1"; shift
    echo "[$LOG_TAG] [$(date '+%Y-%m-%d %H:%M:%S')] [$level]$*"
    log_only "$level" "$*"
}

end_log() {
    log INFO "End time: $(date '+%Y-%m-%d %H:%M:%S')"
}

die() {
    log ERROR "$*"
    end_log
    exit 1
}

# --- options: the driver's option loop and unsupportParam ---------------------------------------
OP=""
QUIET=0
FOR_ALL=0
FORCE=0
OPS=0        # full/run/upgrade: exactly one (the vendor's j)
OTHERS=0     # every option but --install-for-all and --force (the vendor's i): --uninstall stands alone
INPUT_PATH=""
PATH_GIVEN=0
RUN_USER=""
RUN_GROUP=""
USER_GIVEN=0
GROUP_GIVEN=0
INSTALL_TYPE=full
ERR="ERR_NO:0x0004;ERR_DES"
for arg in "$@"; do
    case "$arg" in
        --full) OP=install; OPS=$((OPS + 1)); OTHERS=$((OTHERS + 1)) ;;
        --run) OP=install; INSTALL_TYPE=run; OPS=$((OPS + 1)); OTHERS=$((OTHERS + 1)) ;;
        --upgrade) OP=upgrade; OPS=$((OPS + 1)); OTHERS=$((OTHERS + 1)) ;;
        --uninstall) OP=uninstall; OTHERS=$((OTHERS + 1)) ;;
        --quiet) QUIET=1; OTHERS=$((OTHERS + 1)) ;;
        --force) FORCE=1 ;;
        --install-for-all) FOR_ALL=1 ;;
        --install-path=*) INPUT_PATH="${arg#--install-path=}"; PATH_GIVEN=1; OTHERS=$((OTHERS + 1))
            [ -n "$INPUT_PATH" ] || die "ERR_NO:0x0003;ERR_DES:install path is null, install failed" ;;
        --install-username=*) RUN_USER="${arg#--install-username=}"; USER_GIVEN=1; OTHERS=$((OTHERS + 1)) ;;
        --install-usergroup=*) RUN_GROUP="${arg#--install-usergroup=}"; GROUP_GIVEN=1; OTHERS=$((OTHERS + 1)) ;;
        *) die "$ERR: Unrecognized parameters: $arg. Try './xxx.run --help' for more information." ;;
    esac
done
if [ "$KIND" = firmware ]; then
    # Only the options ascend-deployer gives the firmware; its install.sh is not public.
    [ "$OP" != uninstall ] || die "The firmware cannot be uninstalled; install the firmware version you want with --upgrade."
    if [ "$PATH_GIVEN$USER_GIVEN$GROUP_GIVEN$FOR_ALL$FORCE" != 00000 ]; then
        die "$ERR: Unrecognized parameters for the firmware package: it takes --full or --upgrade, and --quiet; it installs where the driver is installed."
    fi
fi
if [ "$OP" = uninstall ]; then
    [ "$OTHERS" -le 1 ] || die "$ERR:version/uninstall/check can't use with other parameters."
elif [ "$OPS" -ne 1 ]; then
    die "$ERR:param need used with full/run/docker/upgrade/devel."
elif [ "$PATH_GIVEN" = 1 ] && [ "$OP" = upgrade ]; then
    die "$ERR:install-path param need used with full/run/docker/devel."
elif [ "$USER_GIVEN$GROUP_GIVEN" = 11 ] && [ "$OP" = upgrade ]; then
    die "$ERR:install-username and install-usergroup params need used with full/run/docker/devel."
elif [ "$USER_GIVEN$GROUP_GIVEN" = 10 ] || [ "$USER_GIVEN$GROUP_GIVEN" = 01 ]; then
    die "$ERR:Username and usergroup are not specified at the same time. Please input the right params and try again."
fi
if [ "$USER_GIVEN" = 1 ] && [ "$RUN_USER" = root ] && [ "$FOR_ALL" = 0 ]; then
    die "ERR_NO:0x0091;ERR_DES:username not permission for root"
fi
if [ "$GROUP_GIVEN" = 1 ] && [ "$RUN_GROUP" = root ] && [ "$FOR_ALL" = 0 ]; then
    die "ERR_NO:0x0091;ERR_DES:usergroup not permission for root"
fi
NOT_ROOT="ERR_NO:0x0093;ERR_DES:do not have root permission, operation failed, please use root permission!"
[ "$(id -u)" = 0 ] || die "$NOT_ROOT"

RECORD="$SYSROOT/etc/ascend_install.info"
recorded() { [ -f "$RECORD" ] && sed -n "s/^$1=//p" "$RECORD" | head -n 1; }
# The vendor's first_time_install_drv_flag: no driver installation recorded.
FIRST_INSTALL=0
[ -n "$(recorded Driver_Install_Path_Param)" ] || FIRST_INSTALL=1
# An overwrite install keeps the account of the last one (the vendor's getUserInfo).
if [ "$KIND" = driver ] && [ "$USER_GIVEN$GROUP_GIVEN" = 11 ] && [ -n "$(recorded UserName)" ]; then
    if [ "$RUN_USER" != "$(recorded UserName)" ] \
        || { [ -n "$(recorded UserGroup)" ] && [ "$RUN_GROUP" != "$(recorded UserGroup)" ]; }; then
        die "ERR_NO:0x0095;ERR_DES:The user and group are not same with last installation,do not support" \
            "overwriting installation"
    fi
fi
# Where: the path given to a first installation, else the one the installed driver records (an upgrade,
# the firmware, an uninstall), else Huawei's default. The account likewise.
INSTALL_PATH="${INPUT_PATH:-$(recorded Driver_Install_Path_Param)}"
INSTALL_PATH="${INSTALL_PATH:-$SYSROOT/usr/local/Ascend}"
RUN_USER="${RUN_USER:-$(recorded UserName)}"
RUN_USER="${RUN_USER:-HwHiAiUser}"
RUN_GROUP="${RUN_GROUP:-$(recorded UserGroup)}"
RUN_GROUP="${RUN_GROUP:-HwHiAiUser}"
case "$INSTALL_PATH" in
    /*) INSTALL_PATH="${INSTALL_PATH%/}" ;;
    *) die "ERR_NO:0x0003;ERR_DES:The install-path [$INSTALL_PATH] is not an absolute path." ;;
esac

DRIVER_INFO="$INSTALL_PATH/driver/version.info"
FIRMWARE_INFO="$INSTALL_PATH/firmware/version.info"

installed_version() {
    if [ "$KIND" = driver ]; then info_value "$DRIVER_INFO" Version; else info_value "$FIRMWARE_INFO" Version; fi
}

running_version() {  # what the loaded driver / flashed firmware is, per the node's NPU layer
    [ -x "$LAB_DRIVER" ] || return 0
    "$LAB_DRIVER" running "$KIND"
}

lab_fails() {  # the lab hook /etc/atlas-lab/fail-install names this package kind
    [ -f "$LAB_ETC/fail-install" ] && grep -qx "[[:space:]]*$KIND[[:space:]]*" "$LAB_ETC/fail-install"
}

chips_ready() {  # the lab hook /etc/atlas-lab/chips-ready: every chip reports boot status 16
    [ -e "$LAB_ETC/chips-ready" ]
}

set_record() {  # set_record KEY VALUE in /etc/ascend_install.info: in place, else appended (updateInstallParam)
    mkdir -p "$(dirname "$RECORD")" && touch "$RECORD" && chmod 644 "$RECORD"
    if grep -q "^$1=" "$RECORD"; then sed -i "s|^$1=.*|$1=$2|" "$RECORD"; else echo "$1=$2" >> "$RECORD"; fi
}

set_record_once() {  # set_record_once KEY VALUE: only when the record has no value for KEY (UserName, UserGroup)
    [ -n "$(recorded "$1")" ] || set_record "$1" "$2"
}

write_driver_info() {  # the vendor's keys in the vendor's order (25.3.rc1's values for the components)
    cat > "$DRIVER_INFO.tmp" <<VINFO
Version=$VERSION
ascendhal_version=7.35.23
aicpu_version=1.0
tdt_version=1.0
log_version=1.0
prof_version=2.0
dvppkernels_version=1.1
tsfw_version=1.0
Innerversion=$INNERVERSION
compatible_version=[V100R001C19],[V100R001C20],[V100R001C21],[V100R001C22],[V100R001C23]
compatible_version_fw=[7.0.0,8.9.9]
package_version=$VERSION
VINFO
    mv "$DRIVER_INFO.tmp" "$DRIVER_INFO"
}

install_driver() {
    local dir="$INSTALL_PATH/driver"
    id -u "$RUN_USER" >/dev/null 2>&1 || die "ERR_NO:0x0091;ERR_DES:The user $RUN_USER does not exist. Create it first (groupadd $RUN_GROUP; useradd -g $RUN_GROUP -d /home/$RUN_USER -m $RUN_USER -s /bin/bash), or pass --install-username=<user> --install-usergroup=<group>."
    getent group "$RUN_GROUP" >/dev/null || die "ERR_NO:0x0091;ERR_DES:The group $RUN_GROUP does not exist. Create it first (groupadd $RUN_GROUP), or pass --install-usergroup=<group>."
    mkdir -p "$dir" || die "cannot create $dir"
    cp -a "$SELF_DIR/files/driver/." "$dir/" || die "copying files to $dir failed (disk full?)"
    write_driver_info
    mkdir -p "$dir/script"
    cp "$SELF_DIR/install.sh" "$SELF_DIR/common.sh" "$SELF_DIR/package.info" "$dir/script/"
    cat > "$dir/script/uninstall.sh" <<UNINSTALL
#!/bin/bash
# Uninstalls $PKG_NAME $VERSION from $INSTALL_PATH.
exec bash "\$(cd "\$(dirname "\$0")" && pwd)/install.sh" --uninstall
UNINSTALL
    chmod 0750 "$dir/script/uninstall.sh"
    if [ "$FOR_ALL" = 1 ]; then chmod -R u+rwX,go+rX,go-w "$dir"; else chmod -R u+rwX,g+rX,g-w,o-rwx "$dir"; fi
    # updateInstallInfo: the account only where none is recorded, then the driver's keys in place or appended.
    [ -f "$RECORD" ] && sed -i '/^Driver_Install_Status=/d' "$RECORD"
    set_record_once UserName "$RUN_USER"
    set_record_once UserGroup "$RUN_GROUP"
    if [ "$OP" = install ] || [ -z "$(recorded Driver_Install_Type)" ]; then
        set_record Driver_Install_Type "$INSTALL_TYPE"
    fi
    set_record Driver_Install_Path_Param "$INSTALL_PATH"
    set_record Driver_Install_For_All "$([ "$FOR_ALL" = 1 ] && echo yes || echo no)"
    set_record Driver_Install_Mode normal
}

install_firmware() {
    local dir="$INSTALL_PATH/firmware"
    [ -f "$DRIVER_INFO" ] || die "No driver is installed in $INSTALL_PATH: install the driver first, then the firmware (first installation order: driver -> firmware)."
    mkdir -p "$dir" || die "cannot create $dir"
    cp -a "$SELF_DIR/files/firmware/." "$dir/" || die "copying files to $dir failed (disk full?)"
    printf 'Version=%s\nfirmware_version=1.0\npackage_version=%s\ncompatible_version_drv=[%s,%s.]\n' \
        "$VERSION" "$PACKAGE_VERSION" "$PACKAGE_VERSION" "$PACKAGE_VERSION" > "$FIRMWARE_INFO.tmp"
    mv "$FIRMWARE_INFO.tmp" "$FIRMWARE_INFO"
    set_record Firmware_Install_Type full
    set_record Firmware_Install_Path_Param "$INSTALL_PATH"
}

reboot_needed() {  # the closing line of an install that runs only after the next boot; exit status 2
    if [ "$KIND" = driver ]; then
        log INFO "Driver package $1 successfully! Reboot needed for installation/upgrade to take effect!"
    else
        log INFO "Firmware package $1 successfully! Reboot now or after driver installation for the installation/upgrade to take effect."
    fi
    return "$EXIT_REBOOT"
}

takes_effect_now() {
    log INFO "Driver package $1 successfully! The new version takes effect immediately."
    return 0
}

# After the files are in place: does the new version run now, or at the next boot? A first driver install (nothing
# recorded, no driver loaded) runs at once only when every chip comes up; over a running driver the hot reset brings
# the new one up unless a process holds an NPU; --force and new firmware take effect at the next boot.
finish() {
    local running holders done=installed
    [ "$OP" = upgrade ] && done=upgraded
    running=$(running_version)
    if [ -n "$running" ] && [ "$running" = "$VERSION" ]; then
        log INFO "$LOG_TAG package $done successfully! Version $VERSION is already running."
        return 0
    fi
    [ "$KIND" = driver ] || { reboot_needed "$done"; return; }
    [ "$FORCE" = 0 ] && [ -x "$LAB_DRIVER" ] || { reboot_needed "$done"; return; }
    if [ "$running" = none ] && [ "$FIRST_INSTALL" = 1 ]; then
        if chips_ready; then
            "$LAB_DRIVER" load driver || die "loading the driver failed"
            takes_effect_now "$done"
            return
        fi
        log WARNING "There are some chips not ready, please check after reboot"
        reboot_needed "$done"
        return
    fi
    if [ "$running" = none ]; then
        "$LAB_DRIVER" load driver || die "loading the driver failed"
        takes_effect_now "$done"
        return
    fi
    if holders=$("$LAB_DRIVER" hot-reset 2>&1); then
        takes_effect_now "$done"
        return
    fi
    log WARNING "hot reset not done: $holders"
    reboot_needed "$done"
}

CURRENT=$(installed_version)
log INFO "Start time: $(date '+%Y-%m-%d %H:%M:%S')"
log INFO "LogFile: ${LOG_FILE#"$SYSROOT"}"
log INFO "OperationLogFile: ${LOG_DIR#"$SYSROOT"}/operation.log"
log_only INFO "InputParams: $*"
log WARNING "Do not power off or restart the system during the installation/upgrade"

case "$OP" in
    install|upgrade)
        accept_eula "$OP"
        lab_fails && die "Failed to $OP the $KIND package: the atlas lab's $LAB_ETC/fail-install names $KIND. Nothing was changed."
        # over an installed version: the vendor's overwrite installation or upgrade (uninstall, then install), to
        # an older version too
        [ -z "$CURRENT" ] || [ "$CURRENT" = "$VERSION" ] || log INFO "$PKG_NAME $CURRENT is installed in $INSTALL_PATH; replacing it with $VERSION."
        if [ "$KIND" = driver ]; then install_driver; else install_firmware; fi
        ;;
    uninstall)
        [ -n "$CURRENT" ] || die "ERR_NO:0x0080;ERR_DES:Driver package is not installed on this device, uninstall failed"
        rm -rf "${INSTALL_PATH:?}/driver"
        sed -i '/^Driver_Install_\(Path_Param\|Type\|Mode\|For_All\|Status\)=/d' "$RECORD" 2>/dev/null
        grep -qi "Install_Path_Param" "$RECORD" 2>/dev/null || rm -f "$RECORD"
        log INFO "Driver package uninstalled successfully! Reboot needed for uninstallation to take effect!"
        end_log
        exit 0
        ;;
esac
finish
rc=$?
# statusUpdate: a successful driver install appends its status line at the end of the record.
[ "$KIND" = driver ] && echo "Driver_Install_Status=complete" >> "$RECORD"
end_log
exit "$rc"

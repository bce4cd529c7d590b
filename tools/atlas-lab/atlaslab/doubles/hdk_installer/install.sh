#!/bin/bash
# Install logic of an atlas lab HDK test-double package (NPU driver or firmware).
# Reads package.info next to this script. Runtime: bash and coreutils.
#
# What it does like Huawei's packages:
# - options --full/--install, --upgrade, --uninstall (driver), --quiet, --install-for-all,
#   --install-path=, --install-username=/--install-usergroup= (driver; default HwHiAiUser,
#   which must exist: Huawei's install guide creates it before the driver);
# - the firmware needs an installed driver (first install: driver, then firmware);
# - version records at <path>/driver/version.info and <path>/firmware/version.info,
#   /etc/ascend_install.info, an uninstaller at <path>/driver/script/uninstall.sh;
# - exit status 0 done, 1 failure, 2 "installed, reboot needed for it to take effect".
# Lab hook: the node's simulated NPU layer (/usr/local/sbin/atlas-lab-driver) says which
# driver and firmware are running; a driver installed where none runs is loaded at once,
# anything else takes effect at the next boot (the node's atlas-lab-npu-boot unit).
SELF_DIR=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$SELF_DIR/package.info" || { echo "[ERROR] package.info missing in $SELF_DIR" >&2; exit 1; }

# Lab-only hooks (unit tests): ATLAS_HDK_SYSROOT prefixes /etc and /var/log; ATLAS_LAB_DRIVER
# names the running-version helper.
SYSROOT="${ATLAS_HDK_SYSROOT:-}"
LAB_DRIVER="${ATLAS_LAB_DRIVER:-/usr/local/sbin/atlas-lab-driver}"
LOG_DIR="$SYSROOT/var/log/ascend_seclog"
LOG_FILE="$LOG_DIR/ascend_${KIND}_install.log"
EXIT_REBOOT=2

# shellcheck source=/dev/null
. "$SELF_DIR/common.sh" || { echo "[ERROR] common.sh missing in $SELF_DIR" >&2; exit 1; }

# --- options -------------------------------------------------------------------
OP=""
QUIET=0
FOR_ALL=0
INSTALL_PATH=/usr/local/Ascend
RUN_USER=HwHiAiUser
RUN_GROUP=HwHiAiUser
set_op() {
    if [ -n "$OP" ] && [ "$OP" != "$1" ]; then
        die "--$OP and --$1 cannot be used together; choose one of --full, --install, --upgrade, --uninstall"
    fi
    OP="$1"
}
for arg in "$@"; do
    case "$arg" in
        --full|--install) set_op install ;;
        --upgrade) set_op upgrade ;;
        --uninstall) set_op uninstall ;;
        --quiet|-q) QUIET=1 ;;
        --install-for-all) FOR_ALL=1 ;;
        --install-path=*) INSTALL_PATH="${arg#--install-path=}" ;;
        --install-username=*) RUN_USER="${arg#--install-username=}" ;;
        --install-usergroup=*) RUN_GROUP="${arg#--install-usergroup=}" ;;
        *) die "Unrecognized parameter: $arg. Try 'bash ${MS_RUN_FILE:-$PKG_FILE} --help' for more information." ;;
    esac
done
[ -n "$OP" ] || die "No operation given. Use --full, --upgrade or --uninstall (see --help)."
[ "$(id -u)" = 0 ] || die "The $LOG_TAG package is installed by root; run it as root."
case "$INSTALL_PATH" in
    /*) INSTALL_PATH="${INSTALL_PATH%/}" ;;
    *) die "The install path $INSTALL_PATH is not absolute; pass --install-path=/absolute/dir" ;;
esac
if [ "$KIND" = firmware ] && [ "$OP" = uninstall ]; then
    die "The firmware cannot be uninstalled; install the firmware version you want with --upgrade."
fi

DRIVER_INFO="$INSTALL_PATH/driver/version.info"
FIRMWARE_INFO="$INSTALL_PATH/firmware/version.info"
RECORD="$SYSROOT/etc/ascend_install.info"

installed_version() {
    if [ "$KIND" = driver ]; then info_value "$DRIVER_INFO" Version; else info_value "$FIRMWARE_INFO" Version; fi
}

running_version() {  # what the loaded driver / flashed firmware is, per the node's NPU layer
    [ -x "$LAB_DRIVER" ] || return 0
    "$LAB_DRIVER" running "$KIND"
}

set_record() {  # set_record KEY VALUE in /etc/ascend_install.info
    mkdir -p "$(dirname "$RECORD")" && touch "$RECORD"
    if grep -q "^$1=" "$RECORD"; then sed -i "s|^$1=.*|$1=$2|" "$RECORD"; else echo "$1=$2" >> "$RECORD"; fi
}

install_driver() {
    local dir="$INSTALL_PATH/driver"
    id -u "$RUN_USER" >/dev/null 2>&1 || die "The user $RUN_USER does not exist. Create it first (groupadd $RUN_GROUP; useradd -g $RUN_GROUP -d /home/$RUN_USER -m $RUN_USER -s /bin/bash), or pass --install-username=<user> --install-usergroup=<group>."
    getent group "$RUN_GROUP" >/dev/null || die "The group $RUN_GROUP does not exist. Create it first (groupadd $RUN_GROUP), or pass --install-usergroup=<group>."
    mkdir -p "$dir" || die "cannot create $dir"
    cp -a "$SELF_DIR/files/driver/." "$dir/" || die "copying files to $dir failed (disk full?)"
    cat > "$DRIVER_INFO.tmp" <<VINFO
Version=$VERSION
ascendhal_version=7.35.19
Innerversion=$INNERVERSION
compatible_version=[V100R001C15],[V100R001C17],[V100R001C18],[V100R001C19]
package_version=$VERSION
VINFO
    mv "$DRIVER_INFO.tmp" "$DRIVER_INFO"
    mkdir -p "$dir/script"
    cp "$SELF_DIR/install.sh" "$SELF_DIR/common.sh" "$SELF_DIR/package.info" "$dir/script/"
    cat > "$dir/script/uninstall.sh" <<UNINSTALL
#!/bin/bash
# Uninstalls $PKG_NAME $VERSION from $INSTALL_PATH.
exec bash "\$(cd "\$(dirname "\$0")" && pwd)/install.sh" --uninstall --install-path=$INSTALL_PATH "\$@"
UNINSTALL
    chmod 0750 "$dir/script/uninstall.sh"
    if [ "$FOR_ALL" = 1 ]; then chmod -R u+rwX,go+rX,go-w "$dir"; else chmod -R u+rwX,g+rX,g-w,o-rwx "$dir"; fi
    set_record UserName "$RUN_USER"
    set_record UserGroup "$RUN_GROUP"
    set_record Driver_Install_Type full
    set_record Driver_Install_Path_Param "$INSTALL_PATH"
    set_record Driver_Install_For_All "$([ "$FOR_ALL" = 1 ] && echo yes || echo no)"
}

install_firmware() {
    local dir="$INSTALL_PATH/firmware"
    [ -f "$DRIVER_INFO" ] || die "No driver is installed in $INSTALL_PATH: install the driver first, then the firmware (first installation order: driver -> firmware)."
    mkdir -p "$dir" || die "cannot create $dir"
    cp -a "$SELF_DIR/files/firmware/." "$dir/" || die "copying files to $dir failed (disk full?)"
    printf 'Version=%s\nfirmware_version=1.0\npackage_version=%s\n' "$VERSION" "$PACKAGE_VERSION" > "$FIRMWARE_INFO.tmp"
    mv "$FIRMWARE_INFO.tmp" "$FIRMWARE_INFO"
    set_record Firmware_Install_Type full
    set_record Firmware_Install_Path_Param "$INSTALL_PATH"
}

# After the files are in place: does the new version run now, or at the next boot?
finish() {
    local running
    running=$(running_version)
    if [ "$KIND" = driver ] && [ -x "$LAB_DRIVER" ] && [ "$running" = none ]; then
        "$LAB_DRIVER" load driver || die "loading the driver failed"
        log INFO "Driver package installed successfully! The new version takes effect immediately."
        return 0
    fi
    if [ -n "$running" ] && [ "$running" = "$VERSION" ]; then
        log INFO "$LOG_TAG package installed successfully! Version $VERSION is already running."
        return 0
    fi
    if [ "$KIND" = driver ]; then
        log INFO "Driver package installed successfully! Reboot needed for installation/upgrade to take effect!"
    else
        log INFO "Firmware package installed successfully! Reboot now or after driver installation for the installation/upgrade to take effect!"
    fi
    return "$EXIT_REBOOT"
}

CURRENT=$(installed_version)
log INFO "Start time: $(date '+%Y-%m-%d %H:%M:%S')"
log INFO "LogFile: $LOG_FILE"
log INFO "InputParams: $*"

case "$OP" in
    install)
        accept_eula "$OP"
        if [ -n "$CURRENT" ] && [ "$CURRENT" != "$VERSION" ]; then
            die "$PKG_NAME $CURRENT is already installed in $INSTALL_PATH. Use --upgrade to go to $VERSION."
        fi
        if [ "$KIND" = driver ]; then install_driver; else install_firmware; fi
        ;;
    upgrade)
        accept_eula "$OP"
        [ -n "$CURRENT" ] || die "$PKG_NAME is not installed in $INSTALL_PATH, so it cannot be upgraded. Use --full."
        if [ "$CURRENT" != "$VERSION" ]; then
            cur_key=$(ver_key "$CURRENT") ; new_key=$(ver_key "$VERSION")
            if [[ ! "$new_key" > "$cur_key" ]]; then
                die "$PKG_NAME $CURRENT is installed in $INSTALL_PATH and $VERSION is older: --upgrade does not downgrade. Uninstall the driver first (<path>/driver/script/uninstall.sh), then install $VERSION with --full."
            fi
        fi
        if [ "$KIND" = driver ]; then install_driver; else install_firmware; fi
        ;;
    uninstall)
        [ -n "$CURRENT" ] || die "$PKG_NAME is not installed in $INSTALL_PATH; nothing to uninstall."
        rm -rf "${INSTALL_PATH:?}/driver"
        sed -i '/^Driver_/d' "$RECORD" 2>/dev/null
        log INFO "$PKG_NAME $CURRENT uninstall success. Reboot needed for the uninstallation to take effect!"
        log INFO "End time: $(date '+%Y-%m-%d %H:%M:%S')"
        exit "$EXIT_REBOOT"
        ;;
esac
finish
rc=$?
log INFO "End time: $(date '+%Y-%m-%d %H:%M:%S')"
exit "$rc"

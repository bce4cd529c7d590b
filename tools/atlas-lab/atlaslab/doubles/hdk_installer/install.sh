#!/bin/bash
# Install logic of an atlas lab HDK test-double package (NPU driver or firmware).
# Reads package.info next to this script. Runtime: bash and coreutils.
#
# What it does like Huawei's packages:
# - the driver's options and their rules as its install.sh has them (hicann/driver,
#   scripts/package/driver/common/scripts/install.sh: the option loop and unsupportParam):
#   one of --full/--run/--upgrade, or --uninstall alone; --install-path=, --install-username=
#   and --install-usergroup= only with --full/--run (an upgrade keeps the path and account of
#   the installation it upgrades), the account named as a pair, root only with
#   --install-for-all; each refusal is the vendor's message, exit 1;
# - the firmware takes the options its documentation shows (--full, --upgrade, --quiet; the
#   makeself header takes --nox11) and needs an installed driver (first install: driver, then
#   firmware); it installs where the driver's record says;
# - version records at <path>/driver/version.info and <path>/firmware/version.info,
#   /etc/ascend_install.info, an uninstaller at <path>/driver/script/uninstall.sh;
# - exit status 0 installed and running (a first driver, or a hot reset that succeeded), 1
#   failure, 2 installed but running only after a reboot: the hot reset fails while a process
#   holds a /dev/davinciN (the vendor's device_hot_reset.sh, check_user_process), and new
#   firmware is activated at the next boot.
# Lab hook: the node's simulated NPU layer (/usr/local/sbin/atlas-lab-driver) says which
# driver and firmware are running, loads a driver installed where none runs and tries the hot
# reset; anything else takes effect at the next boot (the node's atlas-lab-npu-boot unit).
SELF_DIR=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$SELF_DIR/package.info" || { echo "[ERROR] package.info missing in $SELF_DIR" >&2; exit 1; }

# Lab-only hooks (unit tests): ATLAS_HDK_SYSROOT prefixes /etc, /var/log and the default install
# path; ATLAS_LAB_DRIVER names the running-version helper.
SYSROOT="${ATLAS_HDK_SYSROOT:-}"
LAB_DRIVER="${ATLAS_LAB_DRIVER:-/usr/local/sbin/atlas-lab-driver}"
LOG_DIR="$SYSROOT/var/log/ascend_seclog"
LOG_FILE="$LOG_DIR/ascend_${KIND}_install.log"
EXIT_REBOOT=2

# shellcheck source=/dev/null
. "$SELF_DIR/common.sh" || { echo "[ERROR] common.sh missing in $SELF_DIR" >&2; exit 1; }

# --- options: the driver's option loop and unsupportParam ---------------------------------------
OP=""
QUIET=0
FOR_ALL=0
OPS=0        # full/run/upgrade: exactly one (the vendor's j)
OTHERS=0     # every option but --install-for-all (the vendor's i): --uninstall stands alone
INPUT_PATH=""
PATH_GIVEN=0
RUN_USER=""
RUN_GROUP=""
USER_GIVEN=0
GROUP_GIVEN=0
ERR="ERR_NO:0x0004;ERR_DES"
for arg in "$@"; do
    case "$arg" in
        --full|--run) OP=install; OPS=$((OPS + 1)); OTHERS=$((OTHERS + 1)) ;;
        --upgrade) OP=upgrade; OPS=$((OPS + 1)); OTHERS=$((OTHERS + 1)) ;;
        --uninstall) OP=uninstall; OTHERS=$((OTHERS + 1)) ;;
        --quiet) QUIET=1; OTHERS=$((OTHERS + 1)) ;;
        --install-for-all) FOR_ALL=1 ;;
        --install-path=*) INPUT_PATH="${arg#--install-path=}"; PATH_GIVEN=1; OTHERS=$((OTHERS + 1))
            [ -n "$INPUT_PATH" ] || die "ERR_NO:0x0003;ERR_DES:install path is null, install failed" ;;
        --install-username=*) RUN_USER="${arg#--install-username=}"; USER_GIVEN=1; OTHERS=$((OTHERS + 1)) ;;
        --install-usergroup=*) RUN_GROUP="${arg#--install-usergroup=}"; GROUP_GIVEN=1; OTHERS=$((OTHERS + 1)) ;;
        *) die "$ERR: Unrecognized parameters: $arg. Try './xxx.run --help' for more information." ;;
    esac
done
if [ "$KIND" = firmware ]; then
    # Only the options the firmware's documentation shows; its install.sh is not public.
    [ "$OP" != uninstall ] || die "The firmware cannot be uninstalled; install the firmware version you want with --upgrade."
    if [ "$PATH_GIVEN$USER_GIVEN$GROUP_GIVEN$FOR_ALL" != 0000 ]; then
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
[ "$(id -u)" = 0 ] || die "The $LOG_TAG package is installed by root; run it as root."

RECORD="$SYSROOT/etc/ascend_install.info"
recorded() { [ -f "$RECORD" ] && sed -n "s/^$1=//p" "$RECORD" | head -n 1; }
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
exec bash "\$(cd "\$(dirname "\$0")" && pwd)/install.sh" --uninstall
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

# After the files are in place: does the new version run now, or at the next boot? A first driver loads at
# once; over a running one the hot reset brings the new one up unless a process holds an NPU (the vendor's
# device_hot_reset.sh gives up then); new firmware is activated at the next boot.
finish() {
    local running holders done=installed
    [ "$OP" = upgrade ] && done=upgraded
    running=$(running_version)
    if [ -n "$running" ] && [ "$running" = "$VERSION" ]; then
        log INFO "$LOG_TAG package installed successfully! Version $VERSION is already running."
        return 0
    fi
    if [ "$KIND" = driver ] && [ -x "$LAB_DRIVER" ] && [ "$running" = none ]; then
        "$LAB_DRIVER" load driver || die "loading the driver failed"
        log INFO "Driver package $done successfully! The new version takes effect immediately."
        return 0
    fi
    if [ "$KIND" = driver ] && [ -x "$LAB_DRIVER" ]; then
        if holders=$("$LAB_DRIVER" hot-reset 2>&1); then
            log INFO "Driver package $done successfully! The new version takes effect immediately."
            return 0
        fi
        log WARNING "hot reset not done: $holders"
    fi
    if [ "$KIND" = driver ]; then
        log INFO "Driver package $done successfully! Reboot needed for installation/upgrade to take effect!"
    else
        log INFO "Firmware package $done successfully! Reboot now or after driver installation for the installation/upgrade to take effect!"
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
        # over an installed version: the vendor's overwrite installation (uninstall, then install)
        [ -z "$CURRENT" ] || [ "$CURRENT" = "$VERSION" ] || log INFO "$PKG_NAME $CURRENT is installed in $INSTALL_PATH; overwriting it with $VERSION."
        if [ "$KIND" = driver ]; then install_driver; else install_firmware; fi
        ;;
    upgrade)
        accept_eula "$OP"
        # nothing installed: the vendor's upgrade installs it (first installation)
        if [ -n "$CURRENT" ] && [ "$CURRENT" != "$VERSION" ]; then
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

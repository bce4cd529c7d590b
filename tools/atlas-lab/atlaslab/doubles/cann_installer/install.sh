#!/bin/bash
# Install logic of an atlas lab CANN test-double package (toolkit, kernels, ops, nnal): Huawei's records at their
# real paths (docs/ascend-platform.md section 5.3).
# Reads package.info next to this script. Runtime: bash and coreutils only.
# Lab-only hook: ATLAS_CANN_SYSROOT prefixes /etc and /var/log (default: empty, the real paths).
SELF_DIR=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$SELF_DIR/package.info" || { echo "[ERROR] package.info missing in $SELF_DIR" >&2; exit 1; }

SYSROOT="${ATLAS_CANN_SYSROOT:-}"
if [ "$(id -u)" = 0 ]; then
    LOG_DIR="$SYSROOT/var/log/ascend_seclog"
    DEFAULT_PATH=/usr/local/Ascend
    CANN_RECORD="$SYSROOT/etc/Ascend/ascend_cann_install.info"
else
    LOG_DIR="$HOME/var/log/ascend_seclog"
    DEFAULT_PATH="$HOME/Ascend"
    CANN_RECORD="$HOME/Ascend/ascend_cann_install.info"
fi
LOG_FILE="$LOG_DIR/ascend_${KIND}_install.log"

# shellcheck source=/dev/null
. "$SELF_DIR/common.sh" || { echo "[ERROR] common.sh missing in $SELF_DIR" >&2; exit 1; }

# --- options, and their rules as Huawei's parameter table states them (CANN 8.3.RC1 "参数说明",
# canncommercial/83RC1/softwareinst/instg/instg_0043.html; 8.0.RC3's instg_0046) -----------------------------
OP=""
QUIET=0
FOR_ALL=0
INSTALL_PATH=""
PATH_GIVEN=0
MODE="run"
set_op() {
    if [ -n "$OP" ] && [ "$OP" != "$1" ]; then
        die "--$OP and --$1 cannot be used together; choose one of --install, --full, --devel, --upgrade, --uninstall"
    fi
    OP="$1"
}
for arg in "$@"; do
    case "$arg" in
        --install) set_op install ;;
        --full) set_op install; MODE=full ;;
        --devel) set_op install; MODE=devel ;;
        --upgrade) set_op upgrade ;;
        --uninstall) set_op uninstall ;;
        --quiet|-q) QUIET=1 ;;
        --install-for-all) FOR_ALL=1 ;;
        --install-path=*) INSTALL_PATH="${arg#--install-path=}"; PATH_GIVEN=1 ;;
        --install-path) die "--install-path needs a value: --install-path=<dir>" ;;
        *) die "Unrecognized parameter: $arg. Try 'bash ${MS_RUN_FILE:-$PKG_FILE} --help' for more information." ;;
    esac
done
[ -n "$OP" ] || die "No operation given. Use --install, --full, --devel, --upgrade or --uninstall (see --help)."
if [ "$QUIET" = 1 ] && [ "$OP" = uninstall ]; then
    die "--quiet is used with --install or --upgrade (it accepts the EULA of an installation), not with --uninstall"
fi
if [ "$FOR_ALL" = 1 ] && [ "$OP" = uninstall ]; then
    die "--install-for-all is used with --install, --full, --devel or --upgrade, not with --uninstall"
fi
if [ "$MODE" = full ] && [ "$KIND" != toolkit ]; then
    die "--full is supported by the toolkit package only; install $PKG_NAME with --install"
fi
if [ "$MODE" = devel ] && [ "$KIND" != toolkit ] && [ "$KIND" != kernels ]; then
    die "--devel is supported by the toolkit and kernels packages only; install $PKG_NAME with --install"
fi
# NNAL (ATB's scripts/install.sh): --install and --upgrade first check the toolkit's environment (check_owner: the
# toolkit's set_env.sh sourced, $ASCEND_HOME_PATH a directory owned by the caller), then that --install-path is
# absolute; each refusal prints ATB's own message and exits 1.
atb_fail() {
    local line
    line="[cann-atb] [$(date +%Y%m%d-%H:%M:%S)] [ERROR] $*"
    echo "$line"
    mkdir -p "$LOG_DIR" 2>/dev/null && echo "$line" >> "$LOG_FILE" 2>/dev/null
    exit 1
}
check_owner() {
    if [ -z "${ASCEND_TOOLKIT_HOME:-}" ] && [ -z "${ASCEND_NNAE_HOME:-}" ]; then
        atb_fail "Check owner failed, please check env ASCEND_TOOLKIT_HOME or ASCEND_NNAE_HOME is set."
    fi
    [ -n "${ASCEND_HOME_PATH:-}" ] || atb_fail "Check owner failed, please check env ASCEND_HOME_PATH is set."
    [ -d "$ASCEND_HOME_PATH" ] || atb_fail "Check owner failed, can not find cann in ${ASCEND_HOME_PATH}."
    if [ "$(stat -c %U "$ASCEND_HOME_PATH")" != "$(id -un)" ]; then
        atb_fail "Check owner failed, current owner is not same with CANN."
    fi
}
if [ "$KIND" = nnal ] && [ "$OP" != uninstall ]; then
    check_owner
    if [ "$PATH_GIVEN" = 1 ] && [[ "$INSTALL_PATH" != /* ]]; then
        atb_fail "Install failed, [ERROR] use absolute path for --install-path argument"
    fi
fi
INSTALL_PATH="${INSTALL_PATH:-$DEFAULT_PATH}"
case "$INSTALL_PATH" in
    /*) ;;
    *) die "The install path $INSTALL_PATH is not absolute; pass --install-path=/absolute/dir" ;;
esac
if [[ ! "$INSTALL_PATH" =~ ^/[A-Za-z0-9_./-]*$ ]]; then
    die "The install path $INSTALL_PATH contains characters other than letters, digits, _ . - /; choose another path"
fi
INSTALL_PATH="${INSTALL_PATH%/}"
[ -n "$INSTALL_PATH" ] || INSTALL_PATH=/
# Before 8.2 the path given must be the one the global record holds (8.0.RC3's table); from 8.2 it resets the
# record (8.3.RC1's table).
if [ "$PATH_GIVEN" = 1 ] && [ "$OP" != uninstall ] && [ -f "$CANN_RECORD" ]; then
    recorded_path=$(info_value "$CANN_RECORD" Install_Path)
    if [ -n "$recorded_path" ] && [ "$recorded_path" != "$INSTALL_PATH" ] \
            && [[ "$(ver_key "$VERSION")" < "$(ver_key 8.2.RC1)" ]]; then
        die "The install path $INSTALL_PATH is not the one in $CANN_RECORD ($recorded_path). Install to $recorded_path, or uninstall the CANN packages there and remove $CANN_RECORD first."
    fi
fi

# --- where things live ------------------------------------------------------------
# Versions live side by side (platform-upgrade-facts section 3), each record at its real path
# (docs/ascend-platform.md section 5.3; tests/fixtures/vendor/cann holds one install of each line, and
# tests/unit/collection/test_vendor_contract_cann.py holds this script to them):
# - before 8.5: ascend-toolkit/<v>; ascend-toolkit/latest is a real directory of links into the last installed
#   plus version.cfg (CANN's latest_manager); ascend-toolkit/set_env.sh follows it
# - from 8.5: cann-<v>; `cann` links to the last installed, ascend-toolkit/latest links to `cann`;
#   cann-<v>/set_env.sh, and ascend-toolkit/set_env.sh sources cann/set_env.sh
# - NNAL: nnal/atb/<v>, nnal/atb/latest -> <v> (ATB's installer: ln -snf), nnal/atb/set_env.sh
# The two toolkit layouts do not live together: moving to 8.5 takes --upgrade or uninstalling the earlier
# versions, going back from 8.5 takes --uninstall, then --install (CANN 8.5.0 installation guide and release notes).
ARCHDIR="$ARCH-linux"
TK_BASE="$INSTALL_PATH/ascend-toolkit"
NNAL_BASE="$INSTALL_PATH/nnal/atb"
TOOLKIT_INFO=ascend_toolkit_install.info

layout_of() { if [[ "$(ver_key "$1")" < "$(ver_key 8.5.0)" ]]; then echo ascend-toolkit; else echo cann; fi; }
vdir_of() {  # vdir_of VERSION: the toolkit's version directory
    if [ "$(layout_of "$1")" = cann ]; then echo "$INSTALL_PATH/cann-$1"; else echo "$TK_BASE/$1"; fi
}
OWN_VDIR=$(vdir_of "$VERSION")

toolkit_versions() {  # toolkit_versions LAYOUT: the installed versions of that layout, oldest first
    local dir v
    if [ "$1" = cann ]; then
        for dir in "$INSTALL_PATH"/cann-*/; do
            v="${dir%/}"; v="${v##*/cann-}"
            [ -f "$dir$ARCHDIR/$TOOLKIT_INFO" ] && echo "$v"
        done
    else
        for dir in "$TK_BASE"/*/; do
            v="${dir%/}"; v="${v##*/}"
            [ "$v" = latest ] || [ -L "${dir%/}" ] || [ ! -f "$dir$ARCHDIR/$TOOLKIT_INFO" ] || echo "$v"
        done
    fi | while read -r v; do echo "$(ver_key "$v") $v"; done | sort | cut -d' ' -f2
}

current_toolkit_version() {  # the toolkit version `cann` or ascend-toolkit/latest names
    local home
    for home in "$INSTALL_PATH/cann" "$TK_BASE/latest"; do
        if [ -f "$home/$ARCHDIR/$TOOLKIT_INFO" ]; then info_value "$home/$ARCHDIR/$TOOLKIT_INFO" version; return; fi
    done
}

nnal_value() {  # nnal_value FILE KEY -> the value of NNAL's indented "KEY : value" line
    [ -f "$1" ] || return 1
    sed -n "s/^ *$2 : //p" "$1" | head -n 1
}

record_of() {  # record_of VERSION: this kind's version record of that version
    case "$KIND" in
        toolkit) echo "$(vdir_of "$1")/$ARCHDIR/$TOOLKIT_INFO" ;;
        kernels) echo "$(vdir_of "$1")/opp_kernel/version.info" ;;
        ops) echo "$(vdir_of "$1")/$ARCHDIR/ascend_ops_install.info" ;;
        nnal) echo "$NNAL_BASE/$1/version.info" ;;
    esac
}

release_in() {  # release_in RECORD: the CANN release a record of this kind names
    case "$KIND" in
        toolkit|ops) info_value "$1" version ;;
        kernels) info_value "$1" version_dir ;;
        nnal) nnal_value "$1" Ascend-cann-atb ;;
    esac
}

uninstaller_of() {  # uninstaller_of VERSION: this kind's uninstall script of that version, at its real path
    case "$KIND" in
        toolkit) echo "$(vdir_of "$1")/$ARCHDIR/script/uninstall.sh" ;;
        kernels) echo "$(vdir_of "$1")/opp_kernel/script/uninstall.sh" ;;
        ops) echo "$(vdir_of "$1")/$ARCHDIR/script/ops_uninstall.sh" ;;
        nnal) echo "$NNAL_BASE/$1/scripts/uninstall.sh" ;;
    esac
}

current_version() {  # the version of this kind the links name (the one --upgrade replaces)
    local rec="" tk
    case "$KIND" in
        toolkit|kernels|ops) tk=$(current_toolkit_version); [ -n "$tk" ] && rec=$(record_of "$tk") ;;
        nnal) rec="$NNAL_BASE/latest/version.info" ;;
    esac
    [ -n "$rec" ] && [ -f "$rec" ] || return 0
    release_in "$rec"
}

has_version() { [ -f "$(record_of "$1")" ]; }

# --- file operations ------------------------------------------------------------
set_permissions() {
    local dir="$1"
    if [ "$FOR_ALL" = 1 ]; then chmod -R u+rwX,go+rX,go-w "$dir"; else chmod -R u+rwX,g+rX,g-w,o-rwx "$dir"; fi
}

install_uninstaller() {  # install_uninstaller SCRIPT: SCRIPT runs this package's --uninstall (a copy beside it)
    local script="$1" copy
    copy="$(dirname "$script")/.$(basename "$script" .sh)"
    mkdir -p "$copy" || die "cannot create $copy"
    cp "$SELF_DIR/install.sh" "$SELF_DIR/common.sh" "$SELF_DIR/package.info" "$copy/"
    cat > "$script" <<UNINSTALL
#!/bin/bash
# Uninstalls $PKG_NAME $VERSION from $INSTALL_PATH.
for arg in "\$@"; do
    case "\$arg" in --quiet|-q) ;; *) echo "$(basename "$script"): unrecognized parameter \$arg" >&2; exit 1 ;; esac
done
exec bash "$copy/install.sh" --uninstall --install-path=$INSTALL_PATH
UNINSTALL
    chmod 0750 "$script"
}

write_toolkit_set_env() {  # write_toolkit_set_env FILE TOOLKIT_HOME
    cat > "$1" <<SETENV
export ASCEND_TOOLKIT_HOME=$2
export LD_LIBRARY_PATH=\${ASCEND_TOOLKIT_HOME}/lib64:\${ASCEND_TOOLKIT_HOME}/lib64/plugin/opskernel:\${ASCEND_TOOLKIT_HOME}/lib64/plugin/nnengine:\${ASCEND_TOOLKIT_HOME}/opp/built-in/op_impl/ai_core/tbe/op_tiling/lib/linux/\$(uname -m):\$LD_LIBRARY_PATH
export LD_LIBRARY_PATH=\${ASCEND_TOOLKIT_HOME}/tools/aml/lib64:\${ASCEND_TOOLKIT_HOME}/tools/aml/lib64/plugin:\$LD_LIBRARY_PATH
export PYTHONPATH=\${ASCEND_TOOLKIT_HOME}/python/site-packages:\${ASCEND_TOOLKIT_HOME}/opp/built-in/op_impl/ai_core/tbe:\$PYTHONPATH
export PATH=\${ASCEND_TOOLKIT_HOME}/bin:\${ASCEND_TOOLKIT_HOME}/compiler/ccec_compiler/bin:\${ASCEND_TOOLKIT_HOME}/tools/ccec_compiler/bin:\$PATH
export ASCEND_AICPU_PATH=\${ASCEND_TOOLKIT_HOME}
export ASCEND_OPP_PATH=\${ASCEND_TOOLKIT_HOME}/opp
export TOOLCHAIN_HOME=\${ASCEND_TOOLKIT_HOME}/toolkit
export ASCEND_HOME_PATH=\${ASCEND_TOOLKIT_HOME}
SETENV
    chmod 0755 "$1"
}

write_version_cfg() {  # write_version_cfg FILE VDIR: the latest_manager's record of the components in VDIR
    local file="$1" vdir="$2" kind comp components="toolkit"
    [ -f "$vdir/opp_kernel/version.info" ] && components="toolkit opp_kernel"
    {
        echo "# version: 1.0"
        for kind in running upgrade installed; do
            for comp in $components; do echo "${comp}_${kind}_version=[$BUILD:$(basename "$vdir")]"; done
        done
    } > "$file"
}

point_latest_dir() {  # point_latest_dir VERSION: before 8.5, ascend-toolkit/latest as a real directory of links
    local latest="$TK_BASE/latest" vdir entry name
    vdir=$(vdir_of "$1")
    rm -rf "$latest"
    mkdir -p "$latest/$ARCHDIR"
    for entry in "$vdir"/*; do
        name=$(basename "$entry")
        [ "$name" = "$ARCHDIR" ] || ln -s "../$1/$name" "$latest/$name"
    done
    for entry in "$vdir/$ARCHDIR"/*; do
        ln -s "../../$1/$ARCHDIR/$(basename "$entry")" "$latest/$ARCHDIR/$(basename "$entry")"
    done
    write_version_cfg "$latest/version.cfg" "$vdir"
    write_toolkit_set_env "$TK_BASE/set_env.sh" "$latest"
}

point_toolkit_links() {  # point_toolkit_links VERSION: `cann` or ascend-toolkit/latest (and set_env.sh) at it
    if [ "$(layout_of "$1")" = cann ]; then
        ln -sfn "cann-$1" "$INSTALL_PATH/cann"
        mkdir -p "$TK_BASE"
        rm -rf "$TK_BASE/latest"
        ln -s "$INSTALL_PATH/cann" "$TK_BASE/latest"
        cat > "$TK_BASE/set_env.sh" <<COMPAT
# Kept for scripts written for CANN before 8.5: the toolkit lives in $INSTALL_PATH/cann.
. $INSTALL_PATH/cann/set_env.sh
COMPAT
        chmod 0755 "$TK_BASE/set_env.sh"
    else
        point_latest_dir "$1"
    fi
}

install_toolkit() {
    local vdir="$OWN_VDIR"
    mkdir -p "$vdir" || die "cannot create $vdir; check that $INSTALL_PATH is writable"
    cp -a "$SELF_DIR/files/." "$vdir/" || die "copying files to $vdir failed (disk full?)"
    # Lab-only hook (power-off tests): pause here, files copied but no version record yet.
    if [ -r "$SYSROOT/etc/atlas-lab/cann-install-delay" ]; then
        sleep "$(cat "$SYSROOT/etc/atlas-lab/cann-install-delay")"
    fi
    mkdir -p "$vdir/$ARCHDIR"
    cat > "$vdir/$ARCHDIR/$TOOLKIT_INFO" <<INFOFILE
package_name=$PKG_NAME
version=$VERSION
innerversion=$INNERVERSION
compatible_version=$COMPATIBLE_VERSION
arch=$ARCH
os=linux
path=$vdir/$ARCHDIR
INFOFILE
    install_uninstaller "$(uninstaller_of "$VERSION")"
    # This version's own environment, whatever the links name later: 8.5+ cann-<v>/set_env.sh (what Huawei's
    # 8.5+ images set, ASCEND_TOOLKIT_HOME=<path>/cann-<v>), before 8.5 <v>/bin/setenv.bash.
    if [ "$LAYOUT" = cann ]; then
        write_toolkit_set_env "$vdir/set_env.sh" "$vdir"
    else
        mkdir -p "$vdir/bin"
        write_toolkit_set_env "$vdir/bin/setenv.bash" "$vdir"
    fi
    point_toolkit_links "$VERSION"
    set_permissions "$vdir"
    if [ "$(id -u)" = 0 ]; then
        mkdir -p "$(dirname "$CANN_RECORD")" && echo "Install_Path=$INSTALL_PATH" > "$CANN_RECORD"
    fi
}

uninstall_toolkit() {  # the toolkit takes its kernels/ops with it
    local rest
    rm -rf "$OWN_VDIR"
    if [ "$(current_toolkit_version)" = "" ]; then
        rest=$(toolkit_versions "$LAYOUT" | tail -n 1)
        if [ -n "$rest" ]; then
            point_toolkit_links "$rest"
        else
            rm -rf "$INSTALL_PATH/cann" "$TK_BASE/latest" "$TK_BASE/set_env.sh"
        fi
    fi
    rmdir "$TK_BASE" 2>/dev/null
    if [ "$(id -u)" = 0 ] && [ ! -e "$INSTALL_PATH/cann" ] && [ ! -e "$TK_BASE" ]; then
        rm -f "$CANN_RECORD"
    fi
    return 0
}

install_kernels() {  # before 8.5: into the toolkit's version directory, recorded in opp_kernel/version.info
    local vdir="$OWN_VDIR"
    cp -a "$SELF_DIR/files/." "$vdir/" || die "copying files to $vdir failed (disk full?)"
    mkdir -p "$vdir/opp_kernel"
    cat > "$vdir/opp_kernel/version.info" <<VINFO
Version=$BUILD
version_dir=$VERSION
timestamp=$TIMESTAMP
ops_version=$BUILD
adk_version=$BUILD
required_package_runtime_version="$REQUIRED_RANGE"
required_package_toolkit_version="$REQUIRED_RANGE"
VINFO
    install_uninstaller "$(uninstaller_of "$VERSION")"
    set_permissions "$vdir/opp_kernel"
    set_permissions "$vdir/opp"
    [ "$(current_toolkit_version)" = "$VERSION" ] && point_latest_dir "$VERSION"
    return 0
}

install_ops() {  # 8.5 and later: into cann-<v>, recorded in <arch>-linux/ascend_ops_install.info
    local vdir="$OWN_VDIR"
    cp -a "$SELF_DIR/files/." "$vdir/" || die "copying files to $vdir failed (disk full?)"
    cat > "$vdir/$ARCHDIR/ascend_ops_install.info" <<VINFO
package_name=$PKG_NAME
version=$VERSION
arch=$ARCH
path=$vdir
VINFO
    install_uninstaller "$(uninstaller_of "$VERSION")"
    set_permissions "$vdir/opp"
}

uninstall_kernels() {
    local vdir="$OWN_VDIR"
    rm -rf "$vdir/opp/built-in/op_impl/ai_core/tbe/kernel/ascend$SOC"
    if [ "$KIND" = ops ]; then
        rm -rf "$vdir/$ARCHDIR/ascend_ops_install.info" "$vdir/$ARCHDIR/script/ops_uninstall.sh"
    else
        rm -rf "$vdir/opp_kernel"
        [ "$(current_toolkit_version)" = "$VERSION" ] && point_latest_dir "$VERSION"
    fi
    return 0
}

write_nnal_set_env() {  # write_nnal_set_env FILE ATB_BASE
    cat > "$1" <<SETENV
# Ascend Transformer Boost (NNAL). --cxx_abi=0|1 picks the C++ ABI of the libraries
# (default 1, the ABI of the PyTorch wheels built with the new ABI).
atb_cxx_abi=1
for atb_arg in "\$@"; do
    case "\$atb_arg" in
        --cxx_abi=0) atb_cxx_abi=0 ;;
        --cxx_abi=1) atb_cxx_abi=1 ;;
    esac
done
export ATB_HOME_PATH=$2/cxx_abi_\${atb_cxx_abi}
export LD_LIBRARY_PATH=\${ATB_HOME_PATH}/lib:\${ATB_HOME_PATH}/examples:\${ATB_HOME_PATH}/tests/atbopstest:\$LD_LIBRARY_PATH
export PATH=\${ATB_HOME_PATH}/bin:\$PATH
export ATB_STREAM_SYNC_EVERY_KERNEL_ENABLE=0
export ATB_OPSRUNNER_SETUP_CACHE_ENABLE=1
export ATB_WORKSPACE_MEM_ALLOC_GLOBAL=1
unset atb_arg atb_cxx_abi
SETENV
    chmod 0755 "$1"
}

# From 8.5 the installation guides uninstall NNAL with nnal/nnal_uninstall.sh. What it does with several versions
# is not documented: this double's removes the version nnal/atb/latest names, with that version's uninstaller.
write_nnal_uninstall() {
    cat > "$1" <<'UNINSTALL'
#!/bin/bash
here=$(cd "$(dirname "$0")" && pwd)
version=$(readlink "$here/atb/latest") || { echo "nnal_uninstall.sh: no NNAL is installed in $here" >&2; exit 1; }
exec bash "$here/atb/$version/scripts/uninstall.sh" "$@"
UNINSTALL
    chmod 0750 "$1"
}

install_nnal() {
    local vdir="$NNAL_BASE/$VERSION"
    mkdir -p "$vdir" || die "cannot create $vdir; check that $INSTALL_PATH is writable"
    cp -a "$SELF_DIR/files/." "$vdir/" || die "copying files to $vdir failed (disk full?)"
    # ATB's scripts/release.sh writes version.info from an indented heredoc: "Key : Value", four spaces first.
    cat > "$vdir/version.info" <<VINFO
    Ascend-cann-atb : $VERSION
    Ascend-cann-atb Version : $VERSION.$NNAL_BUILD
    Platform : $ARCH
    branch : $NNAL_BRANCH
    commit id : $COMMIT_ID
VINFO
    install_uninstaller "$(uninstaller_of "$VERSION")"
    write_nnal_set_env "$vdir/atb/set_env.sh" "$vdir/atb"   # this version's own (the suite's per-version pin)
    ln -sfn "$VERSION" "$NNAL_BASE/latest"
    write_nnal_set_env "$NNAL_BASE/set_env.sh" "$NNAL_BASE/latest/atb"
    [ "$LAYOUT" = cann ] && write_nnal_uninstall "$INSTALL_PATH/nnal/nnal_uninstall.sh"
    set_permissions "$vdir"
}

uninstall_nnal() {
    local rest
    rm -rf "${NNAL_BASE:?}/$VERSION"
    if [ "$(readlink "$NNAL_BASE/latest")" = "$VERSION" ]; then
        rest=$(for d in "$NNAL_BASE"/*/; do d="${d%/}"; [ -L "$d" ] || [ ! -f "$d/version.info" ] || echo "$(ver_key "${d##*/}") ${d##*/}"; done | sort | tail -n 1 | cut -d' ' -f2)
        if [ -n "$rest" ]; then ln -sfn "$rest" "$NNAL_BASE/latest"; else rm -f "$NNAL_BASE/latest" "$NNAL_BASE/set_env.sh"; fi
    fi
    rmdir "$NNAL_BASE" 2>/dev/null
    [ -d "$NNAL_BASE" ] || rm -f "$INSTALL_PATH/nnal/nnal_uninstall.sh"
    rmdir "$INSTALL_PATH/nnal" 2>/dev/null
    return 0
}

do_install() {
    case "$KIND" in toolkit) install_toolkit ;; kernels) install_kernels ;; ops) install_ops ;; nnal) install_nnal ;; esac
}
do_uninstall() {
    case "$KIND" in toolkit) uninstall_toolkit ;; kernels|ops) uninstall_kernels ;; nnal) uninstall_nnal ;; esac
}

require_toolkit() {  # kernels/ops and NNAL need the toolkit of their own version (it may sit beside others)
    [ "$KIND" = toolkit ] && return 0
    [ -f "$OWN_VDIR/$ARCHDIR/$TOOLKIT_INFO" ] && return 0
    local others
    others=$( { toolkit_versions ascend-toolkit; toolkit_versions cann; } | tr '\n' ' ')
    if [ -z "$others" ]; then
        die "$PKG_NAME $VERSION needs Ascend-cann-toolkit $VERSION in $INSTALL_PATH, and no toolkit is installed there. Install Ascend-cann-toolkit_${VERSION} first."
    fi
    die "$PKG_NAME $VERSION needs Ascend-cann-toolkit $VERSION, but only ${others% } is installed in $INSTALL_PATH. Install the toolkit of the same version first."
}

# The two toolkit layouts never live side by side.
require_layout() {
    [ "$KIND" = toolkit ] || return 0
    local other
    if [ "$LAYOUT" = cann ]; then
        other=$(toolkit_versions ascend-toolkit | tr '\n' ' ')
        [ -z "$other" ] || die "CANN ${other% } is installed in $INSTALL_PATH/ascend-toolkit: moving to $VERSION (the 8.5 layout, cann-<version>) takes --upgrade, or uninstalling every earlier version first."
    else
        other=$(toolkit_versions cann | tr '\n' ' ')
        [ -z "$other" ] || die "CANN ${other% } is installed in the 8.5 layout ($INSTALL_PATH/cann-<version>): going back to $VERSION takes --uninstall of it first, then --install."
    fi
}

# Remove an installed version of this kind (its own uninstaller does the work).
remove_version() {
    local old="$1" script
    script=$(uninstaller_of "$old")
    if [ -f "$script" ]; then
        bash "$script" --quiet >/dev/null || die "uninstalling $PKG_NAME $old with $script failed"
    else
        die "$PKG_NAME $old is installed but its uninstaller $script is missing; remove $INSTALL_PATH by hand"
    fi
}

# --- main -----------------------------------------------------------------------
CURRENT=$(current_version)
log INFO "Start time: $(date '+%Y-%m-%d %H:%M:%S')"
log INFO "LogFile: $LOG_FILE"
log INFO "InputParams: $*"
log INFO "OperationLogFile: $LOG_FILE"

case "$OP" in
    install)
        accept_eula install
        require_toolkit
        require_layout
        if has_version "$VERSION"; then
            log WARNING "$PKG_NAME $VERSION is already installed in $INSTALL_PATH; installing it again."
        elif [ -n "$CURRENT" ]; then
            log INFO "$PKG_NAME $CURRENT stays installed in $INSTALL_PATH beside $VERSION."
        fi
        mkdir -p "$INSTALL_PATH" || die "cannot create $INSTALL_PATH"
        do_install
        log INFO "$PKG_NAME $VERSION install success, the install path is $INSTALL_PATH."
        ;;
    upgrade)
        accept_eula upgrade
        [ -n "$CURRENT" ] || die "$PKG_NAME is not installed in $INSTALL_PATH, so it cannot be upgraded. Use --install."
        require_toolkit
        if [ "$CURRENT" = "$VERSION" ]; then
            log INFO "$PKG_NAME $VERSION is already installed in $INSTALL_PATH; nothing to upgrade."
        else
            cur_key=$(ver_key "$CURRENT") ; new_key=$(ver_key "$VERSION")
            if [[ ! "$new_key" > "$cur_key" ]]; then
                die "$PKG_NAME $CURRENT is installed in $INSTALL_PATH and $VERSION is older: --upgrade does not downgrade. Run --uninstall for $CURRENT, then --install $VERSION."
            fi
            remove_version "$CURRENT"
            # Into the 8.5 layout: no earlier version stays.
            if [ "$KIND" = toolkit ] && [ "$LAYOUT" = cann ]; then
                for old in $(toolkit_versions ascend-toolkit); do remove_version "$old"; done
            fi
            do_install
            log INFO "$PKG_NAME upgrade from $CURRENT to $VERSION success, the install path is $INSTALL_PATH."
        fi
        ;;
    uninstall)
        if ! has_version "$VERSION"; then
            die "$PKG_NAME $VERSION is not installed in $INSTALL_PATH${CURRENT:+ ($CURRENT is)}; nothing to uninstall. Uninstall another version with its own package or its script/uninstall.sh."
        fi
        do_uninstall
        log INFO "$PKG_NAME $VERSION uninstall success, the path $INSTALL_PATH."
        ;;
esac
log INFO "End time: $(date '+%Y-%m-%d %H:%M:%S')"
exit 0

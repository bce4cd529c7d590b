#!/bin/bash
# Install logic of an atlas lab CANN test-double package (toolkit, kernels, ops, nnal).
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
# Versions live side by side (platform-upgrade-facts section 3): before 8.5 in ascend-toolkit/<v> with
# `latest` on the last installed (CANN's multi-version installation: the latest_manager of
# gitcode.com/cann/asc-devkit), from 8.5 in cann-<v> with `cann` on the last installed, NNAL in
# nnal/atb/<v> with `latest` on the last installed (MindIE's installation guide). The two toolkit layouts do
# not live together: moving to 8.5 takes --upgrade or uninstalling the earlier versions, going back from
# 8.5 takes --uninstall, then --install (CANN 8.5.0 installation guide and release notes).
ARCHDIR="$ARCH-linux"
TK_BASE="$INSTALL_PATH/ascend-toolkit"
NNAL_BASE="$INSTALL_PATH/nnal/atb"

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
            [ -f "$dir$ARCHDIR/ascend_toolkit_install.info" ] && echo "$v"
        done
    else
        for dir in "$TK_BASE"/*/; do
            v="${dir%/}"; v="${v##*/}"
            [ -L "${dir%/}" ] || [ ! -f "$dir$ARCHDIR/ascend_toolkit_install.info" ] || echo "$v"
        done
    fi | while read -r v; do echo "$(ver_key "$v") $v"; done | sort | cut -d' ' -f2
}

current_toolkit_dir() {  # the version directory `cann` or ascend-toolkit/latest points at
    if [ -f "$INSTALL_PATH/cann/$ARCHDIR/ascend_toolkit_install.info" ]; then readlink -f "$INSTALL_PATH/cann"
    elif [ -f "$TK_BASE/latest/$ARCHDIR/ascend_toolkit_install.info" ]; then readlink -f "$TK_BASE/latest"
    fi
}

record_of() {  # record_of VERSION: this kind's version record of that version
    case "$KIND" in
        toolkit) echo "$(vdir_of "$1")/$ARCHDIR/ascend_toolkit_install.info" ;;
        kernels|ops) echo "$(vdir_of "$1")/opp_kernel/version.info" ;;
        nnal) echo "$NNAL_BASE/$1/version.info" ;;
    esac
}

current_version() {  # the version of this kind the links name (the one --upgrade replaces)
    local rec=""
    case "$KIND" in
        toolkit) rec="$(current_toolkit_dir)/$ARCHDIR/ascend_toolkit_install.info" ;;
        kernels|ops) [ -n "$(current_toolkit_dir)" ] && rec="$(current_toolkit_dir)/opp_kernel/version.info" ;;
        nnal) rec="$NNAL_BASE/latest/version.info" ;;
    esac
    [ -n "$rec" ] && [ -f "$rec" ] || return 0
    info_value "$rec" version
}

has_version() { [ -f "$(record_of "$1")" ]; }

# --- file operations ------------------------------------------------------------
set_permissions() {
    local dir="$1"
    if [ "$FOR_ALL" = 1 ]; then chmod -R u+rwX,go+rX,go-w "$dir"; else chmod -R u+rwX,g+rX,g-w,o-rwx "$dir"; fi
}

install_script_copy() {  # install_script_copy DIR: keep an uninstaller with the installed files
    mkdir -p "$1" || die "cannot create $1"
    cp "$SELF_DIR/install.sh" "$SELF_DIR/common.sh" "$SELF_DIR/package.info" "$1/"
    cat > "$1/uninstall.sh" <<UNINSTALL
#!/bin/bash
# Uninstalls $PKG_NAME $VERSION from $INSTALL_PATH.
for arg in "\$@"; do
    case "\$arg" in --quiet|-q) ;; *) echo "uninstall.sh: unrecognized parameter \$arg" >&2; exit 1 ;; esac
done
exec bash "\$(cd "\$(dirname "\$0")" && pwd)/install.sh" --uninstall --install-path=$INSTALL_PATH
UNINSTALL
    chmod 0750 "$1/uninstall.sh"
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

point_toolkit_links() {  # point_toolkit_links VERSION: `cann` or ascend-toolkit/latest (and set_env.sh) at it
    if [ "$(layout_of "$1")" = cann ]; then
        ln -sfn "cann-$1" "$INSTALL_PATH/cann"
        mkdir -p "$TK_BASE"
        ln -sfn "../cann-$1" "$TK_BASE/latest"
        cat > "$TK_BASE/set_env.sh" <<COMPAT
# Kept for scripts written for CANN before 8.5: the toolkit lives in $INSTALL_PATH/cann.
. $INSTALL_PATH/cann/set_env.sh
COMPAT
        chmod 0755 "$TK_BASE/set_env.sh"
    else
        ln -sfn "$1" "$TK_BASE/latest"
        write_toolkit_set_env "$TK_BASE/set_env.sh" "$TK_BASE/latest"
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
    cat > "$vdir/$ARCHDIR/ascend_toolkit_install.info" <<INFOFILE
package_name=$PKG_NAME
version=$VERSION
innerversion=$INNERVERSION
arch=$ARCH
os=linux
path=$vdir/$ARCHDIR
INFOFILE
    cat > "$vdir/$ARCHDIR/ascend_install.info" <<INSTINFO
Toolkit_UserName=$(id -un)
Toolkit_UserGroup=$(id -gn)
Toolkit_Install_Type=$MODE
Toolkit_Install_Path_Param=$INSTALL_PATH
Toolkit_Install_For_All=$([ "$FOR_ALL" = 1 ] && echo yes || echo no)
INSTINFO
    install_script_copy "$vdir/$ARCHDIR/script"
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

uninstall_toolkit() {
    local vdir="$OWN_VDIR" pointed="" rest
    [ "$(current_toolkit_dir)" = "$(readlink -f "$vdir")" ] && pointed=1
    rm -rf "$vdir"
    if [ -n "$pointed" ]; then
        rest=$(toolkit_versions "$LAYOUT" | tail -n 1)
        if [ -n "$rest" ]; then
            point_toolkit_links "$rest"
        else
            rm -f "$INSTALL_PATH/cann" "$TK_BASE/latest" "$TK_BASE/set_env.sh"
        fi
    fi
    rmdir "$TK_BASE" 2>/dev/null
    if [ "$(id -u)" = 0 ] && [ ! -e "$INSTALL_PATH/cann" ] && [ ! -e "$TK_BASE" ]; then
        rm -f "$CANN_RECORD"
    fi
    return 0
}

install_kernels() {  # kernels (< 8.5) and ops (8.5+) go into their toolkit's version directory
    local vdir="$OWN_VDIR" rec
    cp -a "$SELF_DIR/files/." "$vdir/" || die "copying files to $vdir failed (disk full?)"
    rec="$vdir/opp_kernel"
    mkdir -p "$rec"
    cat > "$rec/version.info" <<VINFO
Version=$VERSION
package_name=$PKG_NAME
soc_version=$SOC
innerversion=$INNERVERSION
arch=$ARCH
VINFO
    install_script_copy "$rec/script"
    set_permissions "$rec"
    set_permissions "$vdir/opp"
}

uninstall_kernels() {
    rm -rf "$OWN_VDIR/opp_kernel" "$OWN_VDIR/opp/built-in/op_impl/ai_core/tbe/kernel/ascend$SOC"
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

install_nnal() {
    local vdir="$NNAL_BASE/$VERSION"
    mkdir -p "$vdir" || die "cannot create $vdir; check that $INSTALL_PATH is writable"
    cp -a "$SELF_DIR/files/." "$vdir/" || die "copying files to $vdir failed (disk full?)"
    cat > "$vdir/version.info" <<VINFO
Version=$VERSION
package_name=$PKG_NAME
innerversion=$INNERVERSION
arch=$ARCH
VINFO
    install_script_copy "$vdir/script"
    write_nnal_set_env "$vdir/atb/set_env.sh" "$vdir/atb"   # this version's own (assumed path)
    ln -sfn "$VERSION" "$NNAL_BASE/latest"
    write_nnal_set_env "$NNAL_BASE/set_env.sh" "$NNAL_BASE/latest/atb"
    set_permissions "$vdir"
}

uninstall_nnal() {
    local rest
    rm -rf "${NNAL_BASE:?}/$VERSION"
    if [ "$(readlink "$NNAL_BASE/latest")" = "$VERSION" ]; then
        rest=$(for d in "$NNAL_BASE"/*/; do d="${d%/}"; [ -L "$d" ] || [ ! -f "$d/version.info" ] || echo "$(ver_key "${d##*/}") ${d##*/}"; done | sort | tail -n 1 | cut -d' ' -f2)
        if [ -n "$rest" ]; then ln -sfn "$rest" "$NNAL_BASE/latest"; else rm -f "$NNAL_BASE/latest" "$NNAL_BASE/set_env.sh"; fi
    fi
    rmdir "$NNAL_BASE" "$INSTALL_PATH/nnal" 2>/dev/null
    return 0
}

do_install() { case "$KIND" in toolkit) install_toolkit ;; kernels|ops) install_kernels ;; nnal) install_nnal ;; esac; }
do_uninstall() { case "$KIND" in toolkit) uninstall_toolkit ;; kernels|ops) uninstall_kernels ;; nnal) uninstall_nnal ;; esac; }

require_toolkit() {  # kernels/ops and NNAL need the toolkit of their own version (it may sit beside others)
    [ "$KIND" = toolkit ] && return 0
    [ -f "$OWN_VDIR/$ARCHDIR/ascend_toolkit_install.info" ] && return 0
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
    script="$(dirname "$(record_of "$old")")/script/uninstall.sh"
    [ "$KIND" = toolkit ] && script="$(vdir_of "$old")/$ARCHDIR/script/uninstall.sh"
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

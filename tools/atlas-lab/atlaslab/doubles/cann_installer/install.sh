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
ARCHDIR="$ARCH-linux"
toolkit_info_new="$INSTALL_PATH/cann/$ARCHDIR/ascend_toolkit_install.info"
toolkit_info_old="$INSTALL_PATH/ascend-toolkit/latest/$ARCHDIR/ascend_toolkit_install.info"

installed_toolkit_version() {
    if [ -f "$toolkit_info_new" ]; then info_value "$toolkit_info_new" version
    elif [ -f "$toolkit_info_old" ]; then info_value "$toolkit_info_old" version
    fi
}

toolkit_version_dir() {  # the version directory of the installed toolkit
    if [ -f "$toolkit_info_new" ]; then
        readlink -f "$INSTALL_PATH/cann"
    elif [ -f "$toolkit_info_old" ]; then
        readlink -f "$INSTALL_PATH/ascend-toolkit/latest"
    fi
}

component_record() {  # the version record of this package kind
    case "$KIND" in
        toolkit) if [ -f "$toolkit_info_new" ]; then echo "$toolkit_info_new"; else echo "$toolkit_info_old"; fi ;;
        kernels|ops) echo "$(toolkit_version_dir)/opp_kernel/version.info" ;;
        nnal) echo "$INSTALL_PATH/nnal/atb/latest/version.info" ;;
    esac
}

installed_version() {
    local rec
    rec=$(component_record)
    [ -n "$rec" ] && [ -f "$rec" ] || return 0
    case "$KIND" in
        toolkit) info_value "$rec" version ;;
        *) info_value "$rec" Version ;;
    esac
}


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

install_toolkit() {
    local vdir base
    if [ "$LAYOUT" = cann ]; then
        vdir="$INSTALL_PATH/cann-$VERSION"
    else
        base="$INSTALL_PATH/ascend-toolkit"
        vdir="$base/$VERSION"
    fi
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
    if [ "$LAYOUT" = cann ]; then
        ln -sfn "cann-$VERSION" "$INSTALL_PATH/cann"
        write_toolkit_set_env "$vdir/set_env.sh" "$INSTALL_PATH/cann"
        mkdir -p "$INSTALL_PATH/ascend-toolkit"
        ln -sfn "../cann-$VERSION" "$INSTALL_PATH/ascend-toolkit/latest"
        cat > "$INSTALL_PATH/ascend-toolkit/set_env.sh" <<COMPAT
# Kept for scripts written for CANN before 8.5: the toolkit lives in $INSTALL_PATH/cann.
. $INSTALL_PATH/cann/set_env.sh
COMPAT
        chmod 0755 "$INSTALL_PATH/ascend-toolkit/set_env.sh"
    else
        ln -sfn "$VERSION" "$base/latest"
        write_toolkit_set_env "$base/set_env.sh" "$base/latest"
    fi
    set_permissions "$vdir"
    if [ "$(id -u)" = 0 ]; then
        mkdir -p "$(dirname "$CANN_RECORD")" && echo "Install_Path=$INSTALL_PATH" > "$CANN_RECORD"
    fi
}

uninstall_toolkit() {
    local vdir_new="$INSTALL_PATH/cann-$VERSION" vdir_old="$INSTALL_PATH/ascend-toolkit/$VERSION"
    if [ -d "$vdir_new" ]; then
        rm -rf "$vdir_new"
        [ "$(readlink "$INSTALL_PATH/cann")" = "cann-$VERSION" ] && rm -f "$INSTALL_PATH/cann"
        if [ "$(readlink "$INSTALL_PATH/ascend-toolkit/latest")" = "../cann-$VERSION" ]; then
            rm -f "$INSTALL_PATH/ascend-toolkit/latest" "$INSTALL_PATH/ascend-toolkit/set_env.sh"
        fi
    fi
    if [ -d "$vdir_old" ]; then
        rm -rf "$vdir_old"
        if [ "$(readlink "$INSTALL_PATH/ascend-toolkit/latest")" = "$VERSION" ]; then
            rm -f "$INSTALL_PATH/ascend-toolkit/latest" "$INSTALL_PATH/ascend-toolkit/set_env.sh"
        fi
    fi
    rmdir "$INSTALL_PATH/ascend-toolkit" 2>/dev/null
    if [ "$(id -u)" = 0 ] && [ ! -e "$INSTALL_PATH/cann" ] && [ ! -e "$INSTALL_PATH/ascend-toolkit" ]; then
        rm -f "$CANN_RECORD"
    fi
    return 0
}

install_kernels() {  # kernels (< 8.5) and ops (8.5+) go into the toolkit's version directory
    local vdir rec
    vdir=$(toolkit_version_dir)
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
    local vdir
    vdir=$(toolkit_version_dir)
    [ -n "$vdir" ] || return 0
    rm -rf "$vdir/opp_kernel" "$vdir/opp/built-in/op_impl/ai_core/tbe/kernel/ascend$SOC"
}

install_nnal() {
    local base="$INSTALL_PATH/nnal/atb" vdir
    vdir="$base/$VERSION"
    mkdir -p "$vdir" || die "cannot create $vdir; check that $INSTALL_PATH is writable"
    cp -a "$SELF_DIR/files/." "$vdir/" || die "copying files to $vdir failed (disk full?)"
    cat > "$vdir/version.info" <<VINFO
Version=$VERSION
package_name=$PKG_NAME
innerversion=$INNERVERSION
arch=$ARCH
VINFO
    install_script_copy "$vdir/script"
    ln -sfn "$VERSION" "$base/latest"
    cat > "$base/set_env.sh" <<SETENV
# Ascend Transformer Boost (NNAL). --cxx_abi=0|1 picks the C++ ABI of the libraries
# (default 1, the ABI of the PyTorch wheels built with the new ABI).
atb_cxx_abi=1
for atb_arg in "\$@"; do
    case "\$atb_arg" in
        --cxx_abi=0) atb_cxx_abi=0 ;;
        --cxx_abi=1) atb_cxx_abi=1 ;;
    esac
done
export ATB_HOME_PATH=$base/latest/atb/cxx_abi_\${atb_cxx_abi}
export LD_LIBRARY_PATH=\${ATB_HOME_PATH}/lib:\${ATB_HOME_PATH}/examples:\${ATB_HOME_PATH}/tests/atbopstest:\$LD_LIBRARY_PATH
export PATH=\${ATB_HOME_PATH}/bin:\$PATH
export ATB_STREAM_SYNC_EVERY_KERNEL_ENABLE=0
export ATB_OPSRUNNER_SETUP_CACHE_ENABLE=1
export ATB_WORKSPACE_MEM_ALLOC_GLOBAL=1
unset atb_arg atb_cxx_abi
SETENV
    chmod 0755 "$base/set_env.sh"
    set_permissions "$vdir"
}

uninstall_nnal() {
    local base="$INSTALL_PATH/nnal/atb"
    rm -rf "${base:?}/$VERSION"
    if [ "$(readlink "$base/latest")" = "$VERSION" ]; then
        rm -f "$base/latest" "$base/set_env.sh"
    fi
    rmdir "$base" "$INSTALL_PATH/nnal" 2>/dev/null
    return 0
}

do_install() { case "$KIND" in toolkit) install_toolkit ;; kernels|ops) install_kernels ;; nnal) install_nnal ;; esac; }
do_uninstall() { case "$KIND" in toolkit) uninstall_toolkit ;; kernels|ops) uninstall_kernels ;; nnal) uninstall_nnal ;; esac; }

require_toolkit() {
    local tk
    [ "$KIND" = toolkit ] && return 0
    tk=$(installed_toolkit_version)
    if [ -z "$tk" ]; then
        die "$PKG_NAME $VERSION needs Ascend-cann-toolkit $VERSION in $INSTALL_PATH, and no toolkit is installed there. Install Ascend-cann-toolkit_${VERSION} first."
    fi
    if [ "$tk" != "$VERSION" ]; then
        die "$PKG_NAME $VERSION needs Ascend-cann-toolkit $VERSION, but $tk is installed in $INSTALL_PATH. Install the toolkit of the same version first."
    fi
}

# Remove an installed older version of this kind (its own uninstaller does the work).
remove_version() {
    local old="$1" rec script
    rec=$(component_record)
    script="$(dirname "$rec")/script/uninstall.sh"
    if [ -f "$script" ]; then
        bash "$script" --quiet >/dev/null || die "uninstalling $PKG_NAME $old with $script failed"
    else
        die "$PKG_NAME $old is installed but its uninstaller $script is missing; remove $INSTALL_PATH by hand"
    fi
}

# --- main -----------------------------------------------------------------------
CURRENT=$(installed_version)
log INFO "Start time: $(date '+%Y-%m-%d %H:%M:%S')"
log INFO "LogFile: $LOG_FILE"
log INFO "InputParams: $*"
log INFO "OperationLogFile: $LOG_FILE"

case "$OP" in
    install)
        accept_eula install
        require_toolkit
        if [ -n "$CURRENT" ] && [ "$CURRENT" != "$VERSION" ]; then
            die "$PKG_NAME $CURRENT is already installed in $INSTALL_PATH. Use --upgrade to go to $VERSION, or --uninstall the installed version first to go back."
        fi
        [ -n "$CURRENT" ] && log WARNING "$PKG_NAME $VERSION is already installed in $INSTALL_PATH; installing it again."
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
            do_install
            log INFO "$PKG_NAME upgrade from $CURRENT to $VERSION success, the install path is $INSTALL_PATH."
        fi
        ;;
    uninstall)
        if [ -z "$CURRENT" ]; then
            die "$PKG_NAME is not installed in $INSTALL_PATH; nothing to uninstall."
        fi
        if [ "$CURRENT" != "$VERSION" ]; then
            die "$PKG_NAME $CURRENT is installed in $INSTALL_PATH, not $VERSION. Uninstall it with its own package or $(dirname "$(component_record)")/script/uninstall.sh."
        fi
        do_uninstall
        log INFO "$PKG_NAME $VERSION uninstall success, the path $INSTALL_PATH."
        ;;
esac
log INFO "End time: $(date '+%Y-%m-%d %H:%M:%S')"
exit 0

#!/bin/bash
# Shared by the atlas lab installer doubles (CANN and HDK): logging like Huawei's installers
# (/var/log/ascend_seclog/ascend_<kind>_install.log), version keys, version-record reads.
# Sourced by install.sh after it set LOG_TAG, LOG_DIR and LOG_FILE.

log() {
    local level="$1"; shift
    local line
    line="[$LOG_TAG] [$(date '+%Y-%m-%d %H:%M:%S')] [$level]: $*"
    if [ "$level" = ERROR ]; then echo "$line" >&2; else echo "$line"; fi
    if mkdir -p "$LOG_DIR" 2>/dev/null; then
        chmod 750 "$LOG_DIR" 2>/dev/null
        echo "$line" >> "$LOG_FILE" 2>/dev/null && chmod 640 "$LOG_FILE" 2>/dev/null
    fi
    return 0
}

die() {
    log ERROR "$*"
    exit 1
}

# Sortable key of a CANN or HDK version: 7.0.RC1 < 7.0.0 < 7.0.1.1 < 8.0.RC3 < 8.0.0 < 8.5.0;
# 24.1.rc1 < 24.1.0 < 25.5.0; firmware 7.1.0.6.220 part by part. Pre-release tails
# (.alpha002, -beta.1) are ignored.
ver_key() {
    local v="${1^^}" out rest n
    if [[ "$v" =~ ^([0-9]+)\.([0-9]+)\.RC([0-9]+)(.*)$ ]]; then
        out=$(printf '%05d.%05d.0.%05d' "$((10#${BASH_REMATCH[1]}))" "$((10#${BASH_REMATCH[2]}))" "$((10#${BASH_REMATCH[3]}))")
    elif [[ "$v" =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)(.*)$ ]]; then
        out=$(printf '%05d.%05d.1.%05d' "$((10#${BASH_REMATCH[1]}))" "$((10#${BASH_REMATCH[2]}))" "$((10#${BASH_REMATCH[3]}))")
    else
        echo "unparsable"
        return 1
    fi
    rest="${BASH_REMATCH[4]}"
    while [[ "$rest" =~ ^\.([0-9]+)(.*)$ ]]; do
        n="${BASH_REMATCH[1]}"
        rest="${BASH_REMATCH[2]}"
        out="$out.$(printf '%05d' "$((10#$n))")"
    done
    echo "$out"
}

info_value() {  # info_value FILE KEY -> value of KEY=value (case-insensitive key)
    [ -f "$1" ] || return 1
    sed -n "s/^$2=//Ip" "$1" | head -n 1
}

# The EULA question; --quiet (QUIET=1) accepts it. accept_eula VERB
accept_eula() {
    local verb="$1" answer=""
    [ "$QUIET" = 1 ] && return 0
    printf 'Do you accept the EULA to %s %s?[y/n]' "$verb" "$LOG_TAG"
    if ! read -r answer; then
        echo
        die "No answer to the EULA question (stdin is not interactive). Run with --quiet to accept the EULA non-interactively."
    fi
    case "$answer" in
        y|Y) log INFO "The user accepted the EULA." ;;
        *) die "The user does not accept the EULA; the $verb stops. Run with --quiet to accept it." ;;
    esac
}

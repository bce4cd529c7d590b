#!/bin/bash
# Self-extracting archive in the makeself 2.4 layout (atlas lab test double of a Huawei
# CANN or HDK package). The lines below the header are a gzip-compressed tar payload; its size
# and SHA256 are recorded here and verified before anything is extracted.
# Runtime: bash, coreutils, tar, gzip.
MS_LABEL="@LABEL@"
MS_PKG_FILE="@FILENAME@"
MS_TARGET_DIR="@TARGETDIR@"
MS_SCRIPT="./install.sh"
MS_SHA256="@SHA256@"
MS_MD5="@MD5@"
MS_PAYLOAD_SIZE=@SIZE@
MS_UNPACKED_KB=@UNPACKED_KB@
MS_HEADER_LINES=@HEADER_LINES@
MS_MAKESELF_VERSION="2.4.5"

ms_usage() {
    cat <<USAGE
Usage: $0 [options]
Options:
  --help | -h               Print this message
  --info                    Print embedded info: title, size, target directory, script
  --list                    Print the list of files in the archive
  --check                   Check the integrity of the archive (size and SHA256)
  --quiet | -q              Install without asking; accepts the EULA (with --install,
                            --full, --devel, --upgrade)
  --nox11                   Do not spawn an X terminal (accepted for compatibility)
  --noexec --extract=<dir>  Extract the package to <dir> without installing it
  --install                 Install the package (run mode)
  --full                    Install the package in full mode
  --devel                   Install the package in development mode
  --upgrade                 Upgrade an installed package to this version (no downgrade)
  --uninstall               Uninstall this version of the package
  --install-path=<dir>      Installation path (default: /usr/local/Ascend as root,
                            \$HOME/Ascend otherwise)
  --install-for-all         Make the installation usable by all users
Exit status: 0 success, 1 failure (parameters, dependencies, EULA, install), 2 archive
integrity error.
USAGE
}

ms_offset() {
    head -n "$MS_HEADER_LINES" "$0" | wc -c | tr -d ' '
}

ms_payload() {
    tail -c +"$(( $(ms_offset) + 1 ))" "$0"
}

# Verify the payload's size and SHA256; print what is wrong and return 2 on mismatch.
ms_check() {
    local size sum
    printf 'Verifying archive integrity...' >&2
    size=$(ms_payload | wc -c | tr -d ' ')
    if [ "$size" != "$MS_PAYLOAD_SIZE" ]; then
        printf '\nError in archive size: %s bytes found, %s expected. The archive %s is truncated or corrupted; copy it again from the bundle.\n' \
            "$size" "$MS_PAYLOAD_SIZE" "$MS_PKG_FILE" >&2
        return 2
    fi
    sum=$(ms_payload | sha256sum | cut -d' ' -f1)
    if [ "$sum" != "$MS_SHA256" ]; then
        printf '\nError in SHA256 checksums: %s is different from %s. The archive %s is corrupted; copy it again from the bundle.\n' \
            "$sum" "$MS_SHA256" "$MS_PKG_FILE" >&2
        return 2
    fi
    printf '  100%%   SHA256 checksums are OK. All good.\n' >&2
    return 0
}

ms_info() {
    cat <<INFO
Identification: $MS_LABEL
Target directory: $MS_TARGET_DIR
Uncompressed size: $MS_UNPACKED_KB KB
Compression: gzip
Encryption: n
Built with Makeself version $MS_MAKESELF_VERSION
Script run after extraction:
     $MS_SCRIPT
INFO
}

ms_action=run
ms_noexec=0
ms_extract=""
ms_args=()
for ms_arg in "$@"; do
    case "$ms_arg" in
        --help|-h) ms_usage; exit 0 ;;
        --info) ms_action=info ;;
        --list) ms_action=list ;;
        --check) ms_action=check ;;
        --noexec) ms_noexec=1 ;;
        --extract=*) ms_extract="${ms_arg#--extract=}" ;;
        --extract) echo "Error: --extract needs a directory: --extract=<dir>" >&2; exit 1 ;;
        --nox11) ;;
        *) ms_args+=("$ms_arg") ;;
    esac
done

case "$ms_action" in
    info) ms_info; exit 0 ;;
    list) ms_check || exit 2; ms_payload | tar tzvf -; exit $? ;;
    check) ms_check; exit $? ;;
esac

if [ -n "$ms_extract" ] && [ "$ms_noexec" != 1 ]; then
    echo "Error: --extract=<dir> is used with --noexec: $0 --noexec --extract=$ms_extract" >&2
    exit 1
fi
if [ "$ms_noexec" = 1 ] && [ -z "$ms_extract" ]; then
    echo "Error: --noexec needs --extract=<dir> to say where the files go" >&2
    exit 1
fi

ms_check || exit 2

if [ "$ms_noexec" = 1 ]; then
    case "$ms_extract" in
        /*) ;;
        *) ms_extract="$PWD/$ms_extract" ;;
    esac
    mkdir -p "$ms_extract" || { echo "Error: cannot create $ms_extract" >&2; exit 1; }
    ms_payload | tar xzf - --no-same-owner -C "$ms_extract" || exit 1
    echo "Extracted $MS_PKG_FILE to $ms_extract"
    exit 0
fi

ms_tmp=$(mktemp -d "${TMPDIR:-/tmp}/selfgz.XXXXXXXX") || exit 1
trap 'rm -rf "$ms_tmp"' EXIT
ms_payload | tar xzf - --no-same-owner -C "$ms_tmp" || { echo "Error: extraction of $MS_PKG_FILE failed" >&2; exit 1; }
MS_RUN_FILE="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")" bash "$ms_tmp/install.sh" "${ms_args[@]}"
exit $?

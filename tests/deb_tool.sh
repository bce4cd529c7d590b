#!/bin/sh
# deb_tool.sh PACKAGE PATH DEST: one program out of a Debian package, installed at DEST (an absolute path: the venv's bin/), so the
# tests get the tool and the host gets no package, service or configuration. `apt-get download` needs no root; the
# package lists are refreshed only when they do not name the package.
set -eu
package=$1 member=$2 dest=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
apt-get download -qq "$package" 2>/dev/null || { apt-get update -qq && apt-get download -qq "$package"; }
dpkg-deb --fsys-tarfile "$package"_*.deb | tar -x "$member"
install -m 0755 "$member" "$dest"
echo "$dest: from $(dpkg-deb -f "$package"_*.deb Package Version | tr '\n' ' ')"

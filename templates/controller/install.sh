#!/bin/sh
# Install the atlas-serving controller from this bundle alone: no package index, no network.
#
#   gpgv --keyring <your release key> manifest.json.asc manifest.json   # 1. the bundle is the one you signed
#   sh controller/install.sh [PREFIX]                                   # 2. default PREFIX: /opt/atlas-serving
#
# Before anything is installed, every file under controller/ and suite/ is checked against manifest.json
# (sha256, and no file the manifest does not list). Then:
#   PREFIX/venv        atlasctl, ansible-core, ansible-runner, fabric (controller/wheels, pinned)
#   PREFIX/suite       site.yml, playbooks, roles, ansible.cfg, the example inventory; its collections/
#                      holds atlas.serving installed from controller/atlas-serving-*.tar.gz
# Run it again to repair or upgrade an install: each step replaces what it installs.
set -eu
kit=$(cd "$(dirname "$0")" && pwd)
bundle=$(dirname "$kit")
prefix=${1:-/opt/atlas-serving}

# What the controller's OS provides (Debian: apt-get install python3-venv gnupg openssh-client).
for tool in python3 gpg ssh; do
    command -v "$tool" >/dev/null 2>&1 || { echo "install.sh: nothing installed: $tool is missing on this controller" \
        "(the suite needs it: apt-get install python3-venv gnupg openssh-client)" >&2; exit 1; }
done
python3 -c 'import ensurepip, venv' 2>/dev/null || { echo "install.sh: nothing installed: python3 cannot make a" \
    "virtual environment (apt-get install python3-venv)" >&2; exit 1; }

python3 - "$bundle" <<'PY'
import hashlib, json, os, sys
root = sys.argv[1]
try:
    with open(os.path.join(root, "manifest.json"), encoding="utf-8") as fh:
        listed = {f["path"]: f["sha256"] for f in json.load(fh)["files"]}
except (OSError, ValueError, KeyError, TypeError) as exc:
    sys.exit(f"install.sh: {root}/manifest.json is missing or unreadable ({exc}): copy the bundle again")
bad = []
for top in ("controller", "suite"):
    for base, dirs, names in os.walk(os.path.join(root, top)):
        for name in names:
            rel = os.path.relpath(os.path.join(base, name), root)
            if rel not in listed:
                bad.append(f"{rel} (not in the manifest)")
                continue
            digest = hashlib.sha256()
            with open(os.path.join(root, rel), "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
            if digest.hexdigest() != listed[rel]:
                bad.append(f"{rel} (sha256 differs from the manifest)")
missing = [p for p in listed if p.startswith(("controller/", "suite/")) and not os.path.isfile(os.path.join(root, p))]
bad += [f"{p} (missing)" for p in sorted(missing)]
if bad:
    sys.exit("install.sh: nothing installed; these files are not the bundle's:\n  " + "\n  ".join(bad[:20])
             + "\n  fix: copy the bundle again from the signed original (atlasctl bundle push, or the mirror)")
PY

mkdir -p "$prefix"
python3 -m venv --clear "$prefix/venv"
"$prefix/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index \
    --no-compile --find-links "$kit/wheels" atlasctl
rm -rf "$prefix/suite.new"
cp -R "$bundle/suite" "$prefix/suite.new"
rm -rf "$prefix/suite.new/collections"
ANSIBLE_COLLECTIONS_PATH="$prefix/suite.new/collections" "$prefix/venv/bin/ansible-galaxy" collection install \
    --offline --force -p "$prefix/suite.new/collections" "$kit"/atlas-serving-*.tar.gz >/dev/null
rm -rf "$prefix/suite.old"
if [ -d "$prefix/suite" ]; then mv "$prefix/suite" "$prefix/suite.old"; fi
mv "$prefix/suite.new" "$prefix/suite"
rm -rf "$prefix/suite.old"
echo "installed: $prefix/venv/bin/atlasctl $("$prefix/venv/bin/atlasctl" --version)"
echo "run: cd $prefix/suite && $prefix/venv/bin/ansible-playbook -i <your inventory> site.yml"

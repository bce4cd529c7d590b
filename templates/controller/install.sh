#!/bin/sh
# Install the atlas-serving controller from this bundle alone: no package index, no network.
#
#   gpgv --keyring <your release key> manifest.json.asc manifest.json   # 1. the bundle is the one you signed
#   sh controller/install.sh [PREFIX]                                   # 2. default PREFIX: /opt/atlas-serving
#
# Before anything is installed, every file under controller/ and suite/ is checked against manifest.json
# (size, sha256, md5, and no file the manifest does not list, no symlink). Then:
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
python3 -I -c 'import ensurepip, venv' 2>/dev/null || { echo "install.sh: nothing installed: python3 cannot make a" \
    "virtual environment (apt-get install python3-venv)" >&2; exit 1; }

# The check is the collection's own verifier (module_utils/checksums.py and manifest.py, standard library
# only), the code `atlasctl bundle verify` and the nodes run: size, sha256 and md5 of every file, no file
# the manifest does not list, no symlink followed. It comes from this kit, so its own files are checked
# against the manifest first, and the bytes checked are the bytes run (never read again from the share).
# -I: nothing from the working directory or the environment is imported.
python3 -I - "$bundle" <<'PY'
import hashlib, json, os, sys, types
root = sys.argv[1]
FIX = "\n  fix: copy the bundle again from the signed original (atlasctl bundle push, or the mirror)"
PACKAGE = "ansible_collections.atlas.serving.plugins.module_utils"
VERIFIER = "suite/collections/" + PACKAGE.replace(".", "/")
path = os.path.join(root, "manifest.json")
try:
    with open(path, "rb") as fh:
        text = fh.read().decode("utf-8")
    listed = {f["path"]: f["sha256"] for f in json.loads(text)["files"]}
except (OSError, ValueError, KeyError, TypeError) as exc:
    sys.exit(f"install.sh: nothing installed: {path} is missing or unreadable ({exc})" + FIX)
for name in ("signature", "manifest", "checksums"):  # each imports only the ones before it
    rel = f"{VERIFIER}/{name}.py"
    try:
        fd = os.open(os.path.join(root, rel), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as fh:
            code = fh.read()
    except OSError as exc:
        sys.exit(f"install.sh: nothing installed: the verifier {rel} cannot be read ({exc.strerror})" + FIX)
    if hashlib.sha256(code).hexdigest() != listed.get(rel):
        sys.exit(f"install.sh: nothing installed: the verifier {rel} is not the one manifest.json lists" + FIX)
    module = sys.modules[f"{PACKAGE}.{name}"] = types.ModuleType(f"{PACKAGE}.{name}")
    module.__file__ = os.path.join(root, rel)
    exec(compile(code, module.__file__, "exec"), module.__dict__)
manifest, checksums = sys.modules[f"{PACKAGE}.manifest"], sys.modules[f"{PACKAGE}.checksums"]
bad = []
try:
    data = manifest.parse_json(text, path)
    for top in ("controller", "suite"):
        expected = manifest.parse_bundle_manifest(data, path, prefix=top)
        report = checksums.verify_tree(os.path.join(root, top), expected, stamps_path=None, links="refuse",
                                       listed_in="the manifest")
        bad += [f"{top}/{r.describe()}" for r in report.bad]
except (manifest.ManifestError, checksums.VerifyError) as exc:
    sys.exit(f"install.sh: nothing installed: {exc}" + FIX)
if bad:
    sys.exit("install.sh: nothing installed; these files are not the bundle's:\n  " + "\n  ".join(bad[:20])
             + (f"\n  and {len(bad) - 20} more" if len(bad) > 20 else "") + FIX)
PY

mkdir -p "$prefix"
python3 -I -m venv --clear "$prefix/venv"
"$prefix/venv/bin/python" -I -m pip install --quiet --disable-pip-version-check --no-index \
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

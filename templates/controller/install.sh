#!/bin/sh
# Install the atlas-serving controller from this bundle alone: no package index, no network.
#
#   sh controller/install.sh --keyring /etc/atlas/bundle-signing/trusted.gpg --fingerprint <40 hex> [PREFIX]
#
# --keyring: the release key's public keyring (gpg --export), carried to this controller apart from the bundle;
# --fingerprint: the FULL fingerprint of the key that signs bundles (repeatable); PREFIX: /opt/atlas-serving.
# Before anything is installed:
#   1. manifest.json, its signature, controller/ and suite/ are copied into a private directory (mktemp -d:
#      0700, the invoking user's); everything after reads only that copy, so the share cannot change what
#      is checked or installed;
#   2. the copy's manifest.json.asc is verified with gpgv against the keyring given, and accepted only when
#      it is a good signature by a pinned fingerprint (a signing subkey of one is fine). An unsigned kit, or
#      one with a manifest signed by anyone else (a self-made one), is refused. A keyring inside the bundle
#      is refused: what the bundle brings vouches for nothing;
#   3. every file of the copy's controller/ and suite/ is checked against that manifest (size, sha256, md5;
#      no file it does not list, no symlink, no hard link out of it);
#   4. the wheels are installed with pip --require-hashes, the hashes from that manifest.
# Then:
#   PREFIX/venv        atlasctl, ansible-core, ansible-runner, fabric (controller/wheels, pinned)
#   PREFIX/suite       site.yml, playbooks, roles, ansible.cfg, the example inventory; its collections/
#                      holds atlas.serving installed from controller/atlas-serving-*.tar.gz
# Run it again to repair or upgrade an install: each step replaces what it installs.
#
# This script is where the trust starts: it verifies the rest of the kit, so run the one the signed
# manifest lists (docs/bundle-signing.md, "The controller kit").
set -eu
# All of it is read before any of it runs (sh reads a script as it goes; this one lies on a share).
main() {
usage() {
    echo "usage: sh $0 --keyring FILE --fingerprint FPR [--fingerprint FPR ...] [PREFIX]" >&2
    echo "  fix: give the release key's keyring (gpg --export) and the full fingerprint you pinned" \
        "(docs/bundle-signing.md)" >&2
    exit 2
}
keyring="" fingerprints="" prefix=""
while [ $# -gt 0 ]; do
    case "$1" in
        --keyring) [ $# -ge 2 ] || usage; keyring=$2; shift 2 ;;
        --keyring=*) keyring=${1#--keyring=}; shift ;;
        --fingerprint) [ $# -ge 2 ] || usage; fingerprints="$fingerprints,$2"; shift 2 ;;
        --fingerprint=*) fingerprints="$fingerprints,${1#--fingerprint=}"; shift ;;
        -h|--help) usage ;;
        -*) echo "install.sh: unknown option $1" >&2; usage ;;
        *) [ -z "$prefix" ] || usage; prefix=$1; shift ;;
    esac
done
if [ -z "$keyring" ] || [ -z "$fingerprints" ]; then
    echo "install.sh: nothing installed: no signing key is pinned: --keyring and --fingerprint are required" >&2
    usage
fi
prefix=${prefix:-/opt/atlas-serving}
kit=$(cd "$(dirname "$0")" && pwd)
bundle=$(dirname "$kit")

# What the controller's OS provides (Debian: apt-get install python3-venv gnupg gpgv openssh-client).
for tool in python3 gpg gpgv ssh; do
    command -v "$tool" >/dev/null 2>&1 || { echo "install.sh: nothing installed: $tool is missing on this controller" \
        "(the suite needs it: apt-get install python3-venv gnupg gpgv openssh-client)" >&2; exit 1; }
done
python3 -I -c 'import ensurepip, venv' 2>/dev/null || { echo "install.sh: nothing installed: python3 cannot make a" \
    "virtual environment (apt-get install python3-venv)" >&2; exit 1; }

# 1. The private copy. Symlinks are copied as symlinks (cp -P), and refused by the check below.
work=$(mktemp -d "${TMPDIR:-/tmp}/atlas-install.XXXXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 1' HUP INT TERM
mkdir "$work/bundle"
for item in manifest.json manifest.json.asc controller suite; do
    if [ -e "$bundle/$item" ] || [ -L "$bundle/$item" ]; then
        cp -RP "$bundle/$item" "$work/bundle/" || { echo "install.sh: nothing installed: cannot copy $bundle/$item" >&2
                                                    exit 1; }
    fi
done

# 2 and 3. The signature (gpgv; nothing of the kit runs before it), then the collection's own verifier
# (module_utils/checksums.py with fast_read.py and manifest.py, standard library only: the code `atlasctl bundle
# verify` and the nodes run), its bytes checked against the verified manifest first; the bytes checked are the
# bytes run.
# -I: nothing from the working directory or the environment is imported.
python3 -I - "$work" "$bundle" "$keyring" "$fingerprints" <<'PY'
import base64, hashlib, json, os, re, subprocess, sys, types
work, share, keyring = sys.argv[1:4]
pinned = [value for value in sys.argv[4].split(",") if value.strip()]
root = os.path.join(work, "bundle")
FIX = "\n  fix: copy the bundle again from the signed original (atlasctl bundle push, or the mirror)"
SIGN_FIX = "\n  fix: install only a bundle signed on your signing station (atlasctl bundle sign, docs/bundle-signing.md)"


def refuse(text, fix=FIX):
    sys.exit(f"install.sh: nothing installed: {text}" + fix)


def usage(text):
    print(f"install.sh: nothing installed: {text}\n  fix: pin your signing key: --keyring FILE (gpg --export of "
          "its public key, kept on this controller) --fingerprint <its full 40-hex fingerprint>", file=sys.stderr)
    sys.exit(2)


fingerprints = []
for value in pinned:
    text = re.sub(r"\s+", "", value).upper().removeprefix("0X")
    if not re.fullmatch(r"[0-9A-F]{40}", text):
        usage(f"--fingerprint {value!r} is not a full 40-hex fingerprint (a short key id can be forged)")
    if text == "0" * 40:
        usage("--fingerprint is the example inventory's PLACEHOLDER")
    fingerprints.append(text)
real_keyring, real_share = os.path.realpath(keyring), os.path.realpath(share)
if os.path.commonpath([real_keyring, real_share]) == real_share:
    usage(f"--keyring {keyring} is inside the bundle ({share}): a key the bundle brings vouches for nothing")
try:
    with open(keyring, "rb") as handle:
        keys = handle.read()
except OSError as exc:
    usage(f"--keyring {keyring}: cannot read it ({exc.strerror})")
if keys.lstrip().startswith(b"-----BEGIN PGP PUBLIC KEY BLOCK-----"):  # gpgv reads binary keyrings only
    lines = [line.strip() for line in keys.decode("ascii", "replace").strip().splitlines()]
    body = lines[lines.index("", 1) + 1:] if "" in lines[1:] else lines[1:]
    try:
        keys = base64.b64decode("".join(x for x in body if x and not x.startswith(("=", "-----"))))
    except ValueError as exc:
        usage(f"--keyring {keyring}: not a keyring gpgv can read ({exc}); export it with gpg --export")
for name in ("keyring.gpg", "signed", "gnupg"):
    path = os.path.join(work, name)
    if name == "keyring.gpg":
        with open(path, "xb") as handle:
            handle.write(keys)
    else:
        os.mkdir(path, 0o700)

path = os.path.join(root, "manifest.json")
try:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read()  # the one read: verified, then parsed
except OSError as exc:
    refuse(f"{share}/manifest.json is missing or unreadable ({exc.strerror})")
try:
    fd = os.open(os.path.join(root, "manifest.json.asc"), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as fh:
        signature = fh.read()
except OSError:
    refuse(f"{share}/manifest.json.asc is missing: manifest.json is NOT signed, so nothing vouches for the kit",
           SIGN_FIX)
signed = os.path.join(work, "signed")
for name, data in (("manifest.json", raw), ("manifest.json.asc", signature)):
    with open(os.path.join(signed, name), "xb") as handle:
        handle.write(data)
proc = subprocess.run(["gpgv", "--homedir", os.path.join(work, "gnupg"), "--keyring", os.path.join(work, "keyring.gpg"),
                       "--status-fd", "1", os.path.join(signed, "manifest.json.asc"),
                       os.path.join(signed, "manifest.json")], capture_output=True, text=True, check=False,
                      env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"})
# gpgv's machine-readable status, judged as module_utils/signature.py judges gpg's (which cannot run here: it
# is the kit's, and nothing of the kit runs before its manifest is verified). gpgv exits 0 on a revoked key's
# good signature: the status says REVKEYSIG.
status = {}
for line in proc.stdout.splitlines():
    words = line.split()
    if len(words) > 1 and words[0] == "[GNUPG:]":
        status.setdefault(words[1], []).append(words[2:])
where = f"{share}/manifest.json.asc"
if "BADSIG" in status:
    refuse(f"{where}: BAD signature of manifest.json: the manifest was changed after it was signed (or the "
           "signature was replaced)")
if "REVKEYSIG" in status or "KEYREVOKED" in status:
    refuse(f"{where}: manifest.json is signed by a REVOKED key", SIGN_FIX)
if "EXPKEYSIG" in status:
    refuse(f"{where}: manifest.json is signed by an EXPIRED key", SIGN_FIX)
if "EXPSIG" in status:
    refuse(f"{where}: the signature of manifest.json has EXPIRED", SIGN_FIX)
if "ERRSIG" in status or "NO_PUBKEY" in status:
    refuse(f"{where}: manifest.json is signed by a key that is not in {keyring}", SIGN_FIX)
valid = status.get("VALIDSIG") or []
if not valid:
    refuse(f"{where}: no valid signature of manifest.json in it (gpgv: {proc.stderr.strip()[-300:]})", SIGN_FIX)
signers = {args[0].upper() for args in valid} | {args[-1].upper() for args in valid if len(args) >= 10}
if not signers & set(fingerprints):
    refuse(f"{where}: good signature of manifest.json, but by {', '.join(sorted(signers))}, which is NOT pinned "
           "(--fingerprint): a manifest signed by anyone else", SIGN_FIX)
print(f"install.sh: manifest.json (sha256 {hashlib.sha256(raw).hexdigest()}) signed by a pinned key", file=sys.stderr)

PACKAGE = "ansible_collections.atlas.serving.plugins.module_utils"
VERIFIER = "suite/collections/" + PACKAGE.replace(".", "/")
try:
    text = raw.decode("utf-8")
    files = json.loads(text)["files"]
    listed = {f["path"]: f["sha256"] for f in files}
except (ValueError, KeyError, TypeError) as exc:
    refuse(f"{share}/manifest.json is missing or unreadable ({exc})")
for name in ("signature", "manifest", "fast_read", "checksums"):  # each imports only the ones before it
    rel = f"{VERIFIER}/{name}.py"
    try:
        fd = os.open(os.path.join(root, rel), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as fh:
            code = fh.read()
    except OSError as exc:
        refuse(f"the verifier {rel} cannot be read ({exc.strerror})")
    if hashlib.sha256(code).hexdigest() != listed.get(rel):
        refuse(f"the verifier {rel} is not the one manifest.json lists")
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
    refuse(str(exc).replace(root, share))
if bad:
    refuse("these files are not the bundle's:\n  " + "\n  ".join(bad[:20])
           + (f"\n  and {len(bad) - 20} more" if len(bad) > 20 else ""))

# 4. pip's hash-checking mode: every wheel as name==version with the sha256s the verified manifest lists.
pins = {}
for entry in data["files"]:
    rel = entry["path"]
    if rel.startswith("controller/wheels/") and rel.endswith(".whl") and rel.count("/") == 2:
        name, version = os.path.basename(rel)[: -len(".whl")].split("-")[:2]
        pins.setdefault(f"{name}=={version}", []).append(entry["sha256"])
with open(os.path.join(work, "requirements.txt"), "x", encoding="utf-8") as handle:
    for pin, digests in sorted(pins.items()):
        handle.write(pin + "".join(f" --hash=sha256:{d}" for d in sorted(set(digests))) + "\n")
PY

copy="$work/bundle"
mkdir -p "$prefix"
python3 -I -m venv --clear "$prefix/venv"
"$prefix/venv/bin/python" -I -m pip install --quiet --disable-pip-version-check --no-index --no-cache-dir \
    --no-compile --only-binary=:all: --require-hashes --find-links "$copy/controller/wheels" \
    --requirement "$work/requirements.txt"
rm -rf "$prefix/suite.new"
cp -R "$copy/suite" "$prefix/suite.new"
rm -rf "$prefix/suite.new/collections"
ANSIBLE_COLLECTIONS_PATH="$prefix/suite.new/collections" "$prefix/venv/bin/ansible-galaxy" collection install \
    --offline --force -p "$prefix/suite.new/collections" "$copy"/controller/atlas-serving-*.tar.gz >/dev/null
rm -rf "$prefix/suite.old"
if [ -d "$prefix/suite" ]; then mv "$prefix/suite" "$prefix/suite.old"; fi
mv "$prefix/suite.new" "$prefix/suite"
rm -rf "$prefix/suite.old"
echo "installed: $prefix/venv/bin/atlasctl $("$prefix/venv/bin/atlasctl" --version)"
echo "run: cd $prefix/suite && $prefix/venv/bin/ansible-playbook -i <your inventory> site.yml"
}
main "$@"
exit

# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load a bundle's image into Podman's store and pin it by id (the engines stage of a container release;
module ``atlas.serving.podman_image``). The one place that runs ``podman`` on a node.

:func:`ensure_image`: the manifest's entry for the image (module_utils/manifest.py, the manifest's bytes
checked against the verified sha256 first); ``podman image exists <id>``; when absent, the archive's own id
(module_utils/oci_archive.py) must be the manifest's, then ``podman load -i`` and the id checked again in the
store; a name ``localhost/atlas-serving/<name>:<id 12>`` so ``podman image prune`` (which removes unnamed
images) keeps a rollback's image; the image's record written on the node. Nothing runs by name: the service
runs the id.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable

from ansible_collections.atlas.serving.plugins.module_utils.manifest import (
    ManifestError,
    bundle_image,
    parse_json,
    read_text,
)
from ansible_collections.atlas.serving.plugins.module_utils.oci_archive import ImageArchiveError, image_id

# run_command(argv) -> (rc, stdout, stderr); AnsibleModule.run_command fits.
Runner = Callable[[list], tuple]
NAME_PREFIX = "localhost/atlas-serving/"
_LOADED = re.compile(r"^Loaded image(?:\(s\))?:\s*(.+)$", re.MULTILINE)


class PodmanError(Exception):
    """A step that failed; the message names the image, the node's command and the fix."""


def pin_name(name, image):
    """The name the image gets in Podman's store (never used to run it): one per image id."""
    return f"{NAME_PREFIX}{name}:{image[:12]}"


def exists(run, podman, image):
    rc, _out, err = run([podman, "image", "exists", image])
    if rc not in (0, 1):
        raise PodmanError(f"`{podman} image exists {image}` failed (rc {rc}): {err.strip()[-400:]}; check that "
                          "podman works on this node (`podman info`)")
    return rc == 0


def names(run, podman, image):
    rc, out, err = run([podman, "image", "inspect", "--format", "{{json .RepoTags}}", image])
    if rc != 0:
        raise PodmanError(f"`{podman} image inspect {image}` failed (rc {rc}): {err.strip()[-400:]}")
    try:
        tags = json.loads(out.strip() or "[]")
    except ValueError:
        tags = []
    return [str(t) for t in tags or []]


def loaded_ids(run, podman, output):
    """The ids of what ``podman load`` says it loaded (names or ids), as the store has them."""
    found = []
    for line in _LOADED.findall(output):
        for ref in (r.strip() for r in line.split(",")):
            if not ref:
                continue
            rc, out, _err = run([podman, "image", "inspect", "--format", "{{.Id}}", ref])
            found.append(out.strip() if rc == 0 and out.strip() else ref.removeprefix("sha256:"))
    return found


def write_record(path, record):
    """The image's record (JSON, 0644) written atomically when it differs; True when written."""
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text:
                return False
    except OSError:
        pass
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".image-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return True


def manifest_image(manifest, manifest_sha256, name):
    """The image entry of the bundle manifest at ``manifest``, whose bytes must have ``manifest_sha256``."""
    try:
        data = parse_json(read_text(manifest, manifest_sha256), manifest)
        return bundle_image(data, name, manifest)
    except ManifestError as exc:
        raise PodmanError(str(exc)) from None


def ensure_image(run, podman, bundle_dir, manifest, manifest_sha256, name, record_path, check_mode=False):
    """Bring image ``name`` of the bundle into Podman's store, pinned by its id. Returns a dict: ``changed``,
    ``image`` (the manifest entry), ``loaded`` (a load ran, or would in check mode), ``named``, ``record_written``,
    ``msg``. Raises PodmanError naming what failed."""
    image = manifest_image(manifest, manifest_sha256, name)
    wanted = image["image_id"]
    archive = os.path.join(bundle_dir, image["path"])
    result = {"image": image, "loaded": False, "named": False, "record_written": False, "changed": False}
    if not os.access(podman, os.X_OK):
        if not check_mode:
            raise PodmanError(f"{podman} is not installed: install the OS package podman from the node's mirror "
                              "(the engines stage does: engines_container_packages)")
        result.update(loaded=True, named=True, record_written=True, changed=True,
                      msg=f"would load image {name} ({wanted}) from {archive} once podman is installed")
        return result
    present = exists(run, podman, wanted)
    if not present:
        try:
            have = image_id(archive)
        except ImageArchiveError as exc:
            raise PodmanError(str(exc)) from None
        if have != wanted:
            raise PodmanError(f"{archive} holds image {have}, but the bundle manifest says image {name} is {wanted}: "
                              "the manifest and the archive disagree; rebuild the bundle (atlasctl bundle build)")
        result["loaded"] = True
        if check_mode:
            result.update(changed=True, msg=f"would load image {name} ({wanted}) from {archive}")
            return result
        rc, out, err = run([podman, "load", "-i", archive])
        if rc != 0:
            raise PodmanError(f"`{podman} load -i {archive}` failed (rc {rc}): {(err or out).strip()[-600:]}")
        if not exists(run, podman, wanted):
            got = loaded_ids(run, podman, out + "\n" + err) or ["nothing podman named"]
            raise PodmanError(f"podman loaded {', '.join(got)} from {archive}, not image {wanted} that the bundle "
                              f"manifest records for {name}: the image is not pinned; rebuild the bundle from the "
                              "image archive you mean to run")
    pin = pin_name(name, wanted)
    if pin not in names(run, podman, wanted):
        result["named"] = True
        if not check_mode:
            rc, _out, err = run([podman, "tag", wanted, pin])
            if rc != 0:
                raise PodmanError(f"`{podman} tag {wanted} {pin}` failed (rc {rc}): {err.strip()[-400:]}")
    record = {key: image[key] for key in ("name", "image_id", "variant", "cann", "engine_release", "sha256")}
    if not check_mode:
        result["record_written"] = write_record(record_path, record)
    else:
        try:
            with open(record_path, encoding="utf-8") as handle:
                result["record_written"] = json.load(handle) != record
        except (OSError, ValueError):
            result["record_written"] = True
    result["changed"] = result["loaded"] or result["named"] or result["record_written"]
    verb = "would load" if check_mode else "loaded"
    result["msg"] = (f"{verb} image {name} ({wanted})" if result["loaded"]
                     else f"image {name} ({wanted}) is in podman's store")
    return result

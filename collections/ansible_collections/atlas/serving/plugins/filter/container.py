"""Filters of a container release (``serving_runtime: container``; logic in module_utils/container.py and, for
the bundle manifest's image entries, module_utils/manifest.py; docs/containers.md).

``serving_runtime``             the resolved profile + serving_runtime, serving_image, serving_image_entrypoint
                                -> ``{runtime, image, entrypoint}`` (the inventory wins over the profile)
``bundle_image``                a bundle's manifest.json (parsed) + an image name -> its entry (image_id, variant,
                                cann, engine_release, ...)
``container_npus``              the release's environment + npu_count -> the NPU ids the container is given
``container_env``               the release's environment -> the container's (ASCEND_RT_VISIBLE_DEVICES left out)
``container_env_problems``      an environment -> the values ``podman --env-file`` would not pass as written
``container_run_argv``          a spec -> the ``podman run`` argv the launcher execs
``container_image_problems``    an image entry + host + its NPU names + the profile's release -> why it cannot serve
``container_host_paths``        multi-node? + hccn_tool -> the node paths a container release mounts or passes
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.module_utils import container, manifest

RUNTIMES = ("venv", "container")


def serving_runtime(profile: dict, runtime: str = "", image: str = "", entrypoint: list | None = None) -> dict:
    """The release's runtime: ``serving_runtime`` when set, else the profile's ``runtime``, else ``venv``; for a
    container, the image (``serving_image``) and the engine executable as the image has it
    (``serving_image_entrypoint``, else the profile's ``image_entrypoint``) are required."""
    if not isinstance(profile, dict):
        raise AnsibleFilterError(f"serving_runtime expects the resolved serving profile, got {type(profile).__name__}")
    name = profile.get("name", "the serving profile")
    chosen = str(runtime or profile.get("runtime") or "venv")
    if chosen not in RUNTIMES:
        said = f"serving_runtime {runtime!r}" if runtime else f"profile {name}'s runtime {profile.get('runtime')!r}"
        raise AnsibleFilterError(f"{said} is not one of {', '.join(RUNTIMES)}")
    if chosen == "venv":
        return {"runtime": "venv", "image": None, "entrypoint": []}
    if not image:
        raise AnsibleFilterError(f"serving_runtime is container (profile {name}) but serving_image is not set: name "
                                 "the bundle image the release runs (an `images:` entry of the bundle spec, "
                                 "images/<name>.tar in the bundle)")
    if not isinstance(image, str) or "/" in image or image in (".", ".."):
        raise AnsibleFilterError(f"serving_image {image!r} is not a bundle image name (images/<name>.tar)")
    command = entrypoint if entrypoint not in (None, "", []) else profile.get("image_entrypoint")
    if isinstance(command, str):
        command = [command]
    if not isinstance(command, list) or not command or not all(isinstance(p, str) and p for p in command):
        raise AnsibleFilterError(f"serving_runtime is container (profile {name}) but the engine's executable in image "
                                 f"{image} is not named: set serving_image_entrypoint (a list, e.g. [vllm] or "
                                 "[python3]; it replaces the profile command's bin/<executable>, docs/containers.md)")
    head = (profile.get("command") or [None])[0]
    if not isinstance(head, str) or not head.startswith("bin/"):
        raise AnsibleFilterError(f"profile {name}'s command starts with {head!r}, not bin/<executable>: a container "
                                 "release replaces that executable by serving_image_entrypoint")
    return {"runtime": "container", "image": image, "entrypoint": list(command)}


def bundle_image(data: dict, name: str, source: str = "manifest.json") -> dict:
    try:
        return manifest.bundle_image(data, str(name), str(source))
    except manifest.ManifestError as exc:
        raise AnsibleFilterError(str(exc)) from None


def container_npus(env: dict, npu_count=None) -> list[int]:
    try:
        return container.npus(env, npu_count)
    except container.ContainerError as exc:
        raise AnsibleFilterError(str(exc)) from None


def container_env(env: dict) -> dict:
    return container.container_env(env)


def container_env_problems(env: dict) -> list[str]:
    return container.env_file_problems(env)


def container_run_argv(spec: dict) -> list[str]:
    try:
        return container.run_argv(dict(spec))
    except container.ContainerError as exc:
        raise AnsibleFilterError(str(exc)) from None


def container_image_problems(image: dict, host: str, chips: list, engine_release: str) -> list[str]:
    return container.image_problems(image, host, chips, engine_release)


def container_host_paths(multinode: bool = False, hccn_tool: str = "") -> list[str]:
    return container.host_paths(bool(multinode), str(hccn_tool or ""))


class FilterModule:
    def filters(self):
        return {
            "serving_runtime": serving_runtime,
            "bundle_image": bundle_image,
            "container_npus": container_npus,
            "container_env": container_env,
            "container_env_problems": container_env_problems,
            "container_run_argv": container_run_argv,
            "container_image_problems": container_image_problems,
            "container_host_paths": container_host_paths,
        }

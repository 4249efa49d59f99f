"""The cluster manifests, checked where they must agree with the code and with each other (no
Kubernetes runs here): entrypoints that exist, a config that validates, mounts that match the path
the entrypoint reads, one Ray version everywhere, credentials only from a Secret."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

import raypack
from raypack.config import JobConfig, from_dict

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "cluster" / "k8s"
IMAGE_ROOT = "/opt/raypack"  # where cluster/Dockerfile copies the repository


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((K8S / name).read_text())


def ray_version() -> str:
    """The Ray of the image (cluster/Dockerfile): every manifest must name the same one, and it must
    satisfy raypack's own requirement (pyproject.toml)."""
    dockerfile = (ROOT / "cluster" / "Dockerfile").read_text()
    (tag,) = re.findall(r"^FROM rayproject/ray:(\S+)", dockerfile, flags=re.M)
    return tag.split("-")[0]


def test_the_image_ray_satisfies_the_package_requirement() -> None:
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (ray_dep,) = [d for d in deps if d.startswith("ray[")]
    lower = re.search(r">=\s*([\d.]+)", ray_dep)
    assert lower is not None
    as_tuple = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
    assert as_tuple(ray_version()) >= as_tuple(lower.group(1))


def job_specs() -> list[tuple[str, dict[str, Any], str]]:
    """(manifest, RayJob spec, the raypack command it must run)."""
    return [
        ("rayjob.yaml", load("rayjob.yaml")["spec"], "pack_corpus.py"),
        ("raycronjob-rebuild.yaml", load("raycronjob-rebuild.yaml")["spec"]["jobTemplate"], "rebuild.py"),
    ]


def test_kinds_and_api_versions() -> None:
    assert load("rayjob.yaml")["kind"] == "RayJob"
    assert load("raycronjob-rebuild.yaml")["kind"] == "RayCronJob"
    assert load("configmap.yaml")["kind"] == "ConfigMap"
    for name in ("rayjob.yaml", "raycronjob-rebuild.yaml"):
        assert load(name)["apiVersion"] == "ray.io/v1"


def test_the_configmap_holds_a_valid_config() -> None:
    data = load("configmap.yaml")["data"]
    assert set(data) == {"job.yaml"}
    cfg = from_dict(JobConfig, yaml.safe_load(data["job.yaml"]))
    assert all(p.startswith("s3://") for p in (*cfg.input.paths, cfg.tokenizer.path, cfg.output.path))
    assert "secret" not in data["job.yaml"].lower() and "AWS_" not in data["job.yaml"]


@pytest.mark.parametrize(("name", "spec", "script"), job_specs())
def test_entrypoints_run_existing_scripts_on_the_mounted_config(
    name: str, spec: dict[str, Any], script: str
) -> None:
    argv = shlex.split(spec["entrypoint"])
    assert argv[0] == "python", name
    assert argv[1] == f"{IMAGE_ROOT}/jobs/{script}", name
    assert (ROOT / Path(argv[1]).relative_to(IMAGE_ROOT)).is_file(), name
    config_path = Path(argv[2])
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    (container,) = head["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in head["volumes"]}
    # The config the entrypoint reads is the ConfigMap's key, mounted where the entrypoint looks.
    (volume_name,) = [n for n, path in mounts.items() if Path(path) == config_path.parent]
    assert volumes[volume_name]["configMap"]["name"] == load("configmap.yaml")["metadata"]["name"]
    assert config_path.name in load("configmap.yaml")["data"]
    # Flags after the config are the CLI's own.
    from raypack.cli import _build_parser

    command = "pack" if script == "pack_corpus.py" else "rebuild"
    _build_parser().parse_args([command, *argv[2:]])


@pytest.mark.parametrize(("name", "spec", "script"), job_specs())
def test_every_pod_gets_credentials_from_the_secret_and_one_image(
    name: str, spec: dict[str, Any], script: str
) -> None:
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == ray_version(), f"{name}: rayVersion differs from the image's Ray"
    templates = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    images = set()
    for template in templates:
        for container in template["spec"]["containers"]:
            images.add(container["image"])
            assert {"secretRef": {"name": "raypack-s3"}} in container["envFrom"], name
            assert "env" not in container or all("AWS_SECRET" not in e["name"] for e in container["env"])
            assert container["resources"]["requests"] == container["resources"]["limits"], name
    assert len(images) == 1, f"{name}: head and workers must run one image, got {images}"
    assert spec["shutdownAfterJobFinishes"] is True


def test_the_schedule_is_a_cron_expression() -> None:
    schedule = load("raycronjob-rebuild.yaml")["spec"]["schedule"]
    assert re.fullmatch(r"(\S+\s+){4}\S+", schedule)
    deadline = load("raycronjob-rebuild.yaml")["spec"]["jobTemplate"]["activeDeadlineSeconds"]
    assert deadline < 24 * 3600  # a stuck nightly run must end before the next one starts


def test_dockerfile_matches_the_manifests_and_the_package() -> None:
    dockerfile = (ROOT / "cluster" / "Dockerfile").read_text()
    assert "py311" in dockerfile  # raypack needs Python >= 3.11
    copied = re.findall(r"^COPY .*? (\S+) (/opt/raypack/\S*)$", dockerfile, flags=re.M)
    assert ("jobs", f"{IMAGE_ROOT}/jobs") in copied and ("raypack", f"{IMAGE_ROOT}/raypack") in copied
    assert Path(raypack.__file__).parent == ROOT / "raypack"
    # The packers' numba code is compiled into the image, after raypack is installed.
    assert dockerfile.index("pip install") < dockerfile.index("RUN python -m raypack.packing.warmup")


def test_ray_up_config() -> None:
    cfg = yaml.safe_load((ROOT / "cluster" / "ray-up.yaml").read_text())
    assert cfg["head_node_type"] in cfg["available_node_types"]
    assert cfg["docker"]["image"].split(":")[1].split("-")[0] == ray_version()
    (mount_point,) = [k for k, v in cfg["file_mounts"].items() if v == "."]
    assert any(mount_point in cmd and "pip install" in cmd for cmd in cfg["setup_commands"])
    workers = [t for n, t in cfg["available_node_types"].items() if n != cfg["head_node_type"]]
    assert sum(t["max_workers"] for t in workers) <= cfg["max_workers"]
    text = (ROOT / "cluster" / "ray-up.yaml").read_text()
    assert "AWS_SECRET_ACCESS_KEY" not in text and "aws_secret" not in text.lower()

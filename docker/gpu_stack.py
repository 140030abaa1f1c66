"""The image's GPU stack, one CUDA major: used by docker/Dockerfile while it builds, and runnable in the
container (``python docker/gpu_stack.py check``) or in any venv with the ``gpu`` extra.

``floor``  prints pip constraints that keep torch's CUDA library wheels from being older than the conda
           libraries the RAPIDS image links against. Today that is nvJitLink alone: torch pins its other
           CUDA libraries exactly (cuda-toolkit==13.x.y) but not nvJitLink, and nvJitLink is the one CUDA
           library that is not backward compatible (it cannot link code from a newer nvJitLink). Whichever
           copy loads first serves the whole process, so torch's must be at least the image's.
``check``  imports torch, then cuML (with cuml.dask), CuPy, RMM and dask-cuda in the same process, as a
           job does; fails unless torch is a CUDA <major> build and every import succeeds. Python loads
           extension libraries with RTLD_NOW, so a CUDA library of torch's that lacks a symbol RAPIDS needs
           fails the import here, without a GPU. ``--rapids-first`` imports in the other order. It prints
           the file every CUDA library was loaded from, and where a GPU is visible it also runs a small
           torch matmul, a CuPy array shared with torch through DLPack and a cuML KMeans fit.
"""

import argparse
import glob
import importlib
import json
import os
import re
import sys

CUDA_MAJOR = "13"
RAPIDS = ("cuml", "cuml.dask.cluster", "cuml.dask.decomposition", "cupy", "rmm", "dask_cuda", "raft_dask", "dask_cudf")
# conda package -> the pip wheel torch brings for the same library, held at or above the conda version
FLOORS = {"libnvjitlink": "nvidia-nvjitlink"}
CUDA_LIB = re.compile(r"/(lib(?:cu|nv)[A-Za-z0-9_]*\.so[.0-9]*)$")


def floor() -> None:
    for conda_name, wheel in FLOORS.items():
        for path in glob.glob(os.path.join(sys.prefix, "conda-meta", f"{conda_name}-[0-9]*.json")):
            with open(path) as f:
                meta = json.load(f)
            if meta.get("name") == conda_name:
                print(f"{wheel}>={meta['version']}")


def loaded_cuda_libraries() -> dict[str, set[str]]:
    """Each CUDA library's file name -> the files it was loaded from (two would be two copies)."""
    libs: dict[str, set[str]] = {}
    with open("/proc/self/maps") as f:
        for line in f:
            m = CUDA_LIB.search(line.strip())
            if m:
                libs.setdefault(m.group(1), set()).add(os.path.dirname(line.split()[-1]))
    return libs


def check(rapids_first: bool) -> None:
    order = [*RAPIDS, "torch"] if rapids_first else ["torch", *RAPIDS]
    for module in order:
        importlib.import_module(module)  # an ImportError (a missing symbol) fails the check
    import cuml
    import cupy
    import torch

    cuda = torch.version.cuda or "none"
    print(f"gpu stack: torch {torch.__version__} (CUDA {cuda}), cuML {cuml.__version__}, CuPy {cupy.__version__}")
    if not cuda.startswith(CUDA_MAJOR + "."):
        sys.exit(f"gpu stack: torch is not a CUDA {CUDA_MAJOR} build: torch.version.cuda is {cuda}")
    for name, dirs in sorted(loaded_cuda_libraries().items()):
        twice = " (WARNING: two copies in one process)" if len(dirs) > 1 else ""
        print(f"gpu stack: {name} from {', '.join(sorted(dirs))}{twice}")
    if torch.cuda.is_available():
        x = torch.randn(256, 16, device="cuda")
        (x @ x.T).sum().item()
        shared = cupy.from_dlpack(x)  # the same device memory, seen by CuPy
        assert shared.shape == (256, 16) and abs(float(shared.sum()) - float(x.sum())) < 1e-2
        from cuml.cluster import KMeans

        labels = KMeans(n_clusters=4, random_state=0).fit_predict(shared)
        print(f"gpu stack: on {torch.cuda.get_device_name(0)}: torch, CuPy (DLPack) and cuML KMeans ran", labels.shape)
    else:
        print("gpu stack: no GPU visible: imports checked, nothing run on a device")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("floor", help="pip constraints: torch's CUDA wheels at least the image's conda libraries")
    checker = sub.add_parser("check", help="torch is a CUDA build of the stack's major; RAPIDS imports after it")
    checker.add_argument("--rapids-first", action="store_true", help="import RAPIDS before torch instead")
    args = parser.parse_args()
    floor() if args.command == "floor" else check(args.rapids_first)


if __name__ == "__main__":
    main()

"""The documented GPU install resolves to one CUDA stack.

The install the docs give (README, docs/deployment.md, jobs/squad_v2.yaml) is one command,
``pip install -e '.[gpu]'``: the ``gpu`` extra brings torch, torchvision, cuML (with cuml.dask), dask-cuda,
RMM and CuPy, all for CUDA 13, from PyPI alone. In the contract tier (``bash tests/contract/run.sh``, the
venv the estimators are built in) a resolver dry run of exactly that command, against the public index
alone, must succeed, and what it would install must be one CUDA major: the ``-cu13`` RAPIDS wheels, CuPy's
``cuda13x``, a torch whose CUDA libraries are CUDA 13, and no ``-cu12`` package anywhere.

The public index alone: this machine's pip configuration adds local mirrors whose CPU-only torch builds hide
a clash (they need no CUDA libraries), so the dry run ignores every pip configuration file and the ``PIP_*``
variables that choose where packages come from. It needs the index: unreachable, the test fails and says
so; ``RAPIDS_CONTRACT_OFFLINE=1`` skips it on a machine that is offline on purpose. It reads metadata only
(PEP 658, or HTTP range requests where the index serves no metadata files): about a minute here.

The other tests read the files and run everywhere: the docs give that one command and no other package
index, and docker/Dockerfile's image and torch are the extra's release and CUDA major.
"""

import importlib.metadata as md
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[2]
INSTALL = "pip install -e '.[gpu]'"  # the documented GPU install, word for word
CUDA_MAJOR = 13
# what the dry run must resolve: the model stack and every RAPIDS piece the project calls
GPU_STACK = ("torch", "torchvision", "cuml-cu13", "cupy-cuda13x", "rmm-cu13", "dask-cuda")
GPU_STACK += ("raft-dask-cu13", "dask-cudf-cu13")  # what cuml.dask needs
OFFLINE = "RAPIDS_CONTRACT_OFFLINE"
MIN_PIP = "25.1"  # the oldest pip that resolves the extra without backtracking (docs/install.md, tests/contract/run.sh)
IN_TIER = importlib.util.find_spec("cuml") is not None  # the contract tier's venv (run.sh)
# PIP_* variables that only say how to talk to an index, not which one or what to allow: kept
PIP_TRANSPORT = {"PIP_CERT", "PIP_CLIENT_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_TIMEOUT", "PIP_RETRIES", "PIP_PROXY"}
UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|"
    r"Name or service not known|Network is unreachable|Connection refused|ConnectTimeout|ReadTimeout|"
    r"Max retries exceeded|ProxyError|SSLError|CERTIFICATE_VERIFY_FAILED"
)
in_tier = pytest.mark.skipif(not IN_TIER, reason="runs in the contract tier's venv: bash tests/contract/run.sh")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def cuda_major(name: str) -> int | None:
    """The CUDA major a distribution's name says it is built for: foo-cu12, cupy-cuda13x."""
    m = re.search(r"-cu(\d+)$", name) or re.fullmatch(r"cupy-cuda(\d+)x", name)
    return int(m.group(1)) if m else None


def gpu_extra() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]


def extra_spec(package: str) -> str:
    """The gpu extra's requirement for one package, e.g. 'torch>=2.11'."""
    (spec,) = [r for r in gpu_extra() if canonical(re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0]) == package]
    return spec


# -- the docs and the image say the same (no network) -----------------------------------------------------


def test_the_extra_is_one_cuda_major():
    majors = {r: cuda_major(canonical(re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0])) for r in gpu_extra()}
    assert {m for m in majors.values() if m is not None} == {CUDA_MAJOR}, majors
    # torch pinned exactly, so pip settles it (and its exact cuda-toolkit) before RAPIDS' cuda-toolkit==13.*, and
    # torchvision to the one release line built for it: a torch range backtracks (pyproject.toml says why)
    assert re.fullmatch(r"torch==2\.\d+\.\d+", extra_spec("torch")), extra_spec("torch")
    torch_minor = int(extra_spec("torch").split(".")[1])
    # torchvision 0.N pairs with torch 2.(N-15): 0.29 with 2.14
    assert extra_spec("torchvision") == f"torchvision==0.{torch_minor + 15}.*", extra_spec("torchvision")


def test_the_docs_give_the_one_gpu_install_and_no_other_index():
    for doc in ("README.md", "docs/deployment.md", "jobs/squad_v2.yaml"):
        assert INSTALL in (REPO / doc).read_text(), f"{doc} does not give the GPU install `{INSTALL}`"
    docs = [REPO / "README.md", REPO / "docs" / "deployment.md", REPO / "docker" / "README.md"]
    docs += sorted((REPO / "jobs").glob("*.yaml"))
    for doc in docs:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if "pip install" not in line:
                continue
            where = f"{doc.relative_to(REPO)}:{n}: {line.strip()}"
            # another index would bring torch or RAPIDS builds the dry run below never saw
            assert not re.search(r"--(extra-)?index-url|download\.pytorch\.org", line), where
            assert not re.search(r"-cu12\b|cuda12x|cu12\d\b", line), where


def test_the_install_manual_gives_the_gpu_install_and_only_the_cpu_index():
    """docs/install.md: the GPU install after a pip upgrade, with the minimum pip the dry run below asks for; the one
    other index it names is PyTorch's CPU-only one, for the CPU route, never beside the gpu extra."""
    text = (REPO / "docs" / "install.md").read_text()
    assert INSTALL in text and "python -m pip install --upgrade pip" in text
    assert f"pip {MIN_PIP} or newer" in text
    for n, line in enumerate(text.splitlines(), 1):
        if "pip install" in line and re.search(r"--(extra-)?index-url", line):
            assert "https://download.pytorch.org/whl/cpu" in line and "[gpu]" not in line, f"docs/install.md:{n}"


def test_the_image_is_the_extras_release_and_cuda_major():
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    image = re.search(r"^ARG RAPIDS_IMAGE=rapidsai/base:(\d+\.\d+)-cuda(\d+)-py3\.\d+$", dockerfile, re.MULTILINE)
    assert image, "docker/Dockerfile: no ARG RAPIDS_IMAGE=rapidsai/base:<release>-cuda<major>-py<version>"
    release, major = image.group(1), int(image.group(2))
    assert major == CUDA_MAJOR
    for package in ("cuml-cu13", "dask-cuda", "rmm-cu13"):
        assert re.search(rf"=={re.escape(release)}\.\*$", extra_spec(package)), (package, release)
    # torch: the extra's pair, and the build refuses a torch that is not a CUDA 13 build or after which
    # RAPIDS does not import (docker/gpu_stack.py check, run by the build)
    torch = re.search(r'^ARG TORCH_PACKAGES="([^"]*)"$', dockerfile, re.MULTILINE)
    assert torch and torch.group(1).split() == [extra_spec("torch"), extra_spec("torchvision")], torch
    assert re.search(r"^ && python docker/gpu_stack\.py check \\$", dockerfile, re.MULTILINE)
    assert f'CUDA_MAJOR = "{CUDA_MAJOR}"' in (REPO / "docker" / "gpu_stack.py").read_text()


# -- the contract tier's own venv -------------------------------------------------------------------------


@in_tier
def test_the_tier_venv_is_one_cuda_major():
    installed = {canonical(d.metadata["Name"]): d.version for d in md.distributions()}
    majors = {name: cuda_major(name) for name in installed if cuda_major(name) is not None}
    assert set(majors.values()) == {CUDA_MAJOR}, majors
    if "cuda-toolkit" in installed:
        assert installed["cuda-toolkit"].startswith(f"{CUDA_MAJOR}."), installed["cuda-toolkit"]


# -- the resolver dry run of the documented install against the public index ------------------------------


def _pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in PIP_TRANSPORT}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def _pip(*args: str, timeout: float) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", *args]
    try:
        return subprocess.run(cmd, check=False, env=_pip_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`{' '.join(cmd)}` took more than {timeout:.0f} s")


def _tail(proc: subprocess.CompletedProcess, lines: int = 40) -> str:
    text = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines() if line.strip())
    return "\n".join(text.splitlines()[-lines:])


def _unreachable(proc: subprocess.CompletedProcess) -> None:
    pytest.fail(
        "the public package index could not be reached, so the documented GPU install was not checked "
        f"(pip said:\n{_tail(proc, 8)}\n). CI has the index; on a machine offline on purpose, "
        f"{OFFLINE}=1 skips this test (tests/contract/run.sh)."
    )


@in_tier
def test_the_documented_gpu_install_resolves_to_one_cuda_major(tmp_path, capsys):
    if os.environ.get(OFFLINE) == "1":
        pytest.skip(f"{OFFLINE}=1: the documented GPU install's resolver dry run against the public index was not run")
    from packaging.version import Version

    pip = md.version("pip")
    assert Version(pip) >= Version(MIN_PIP), (
        f"pip {pip}: the docs ask for pip {MIN_PIP} or newer (older ones back off through cuda-toolkit versions "
        "before they settle torch's with cuML's, docs/install.md); run.sh's build_venv upgrades it"
    )
    # the index first, briefly: an unreachable index then fails in seconds, not after pip's retries
    probe = _pip("index", "versions", "dask-cuda", "--retries", "1", "--timeout", "30", timeout=120)
    if probe.returncode != 0 and UNREACHABLE.search(probe.stdout + probe.stderr):
        _unreachable(probe)
    assert probe.returncode == 0, f"`pip index versions dask-cuda` failed:\n{_tail(probe)}"

    # the project as the docs install it, copied so that building its metadata writes nothing into the checkout
    src = tmp_path / "rapids_attn_src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(REPO / "rapids_attn", src / "rapids_attn", ignore=ignore)
    report = tmp_path / "report.json"
    words = INSTALL.split()  # pip install -e '.[gpu]'
    assert words[:3] == ["pip", "install", "-e"]
    extras = words[3].strip("'").removeprefix(".")  # '.[gpu]' -> [gpu]
    target = f"{src}{extras}"
    # not --quiet: where it fails, the tail of pip's output names the conflict
    args = ["install", "--dry-run", "--ignore-installed", "--report", str(report), "-e", target]
    start = time.monotonic()
    # fast-deps: where the index serves no PEP 658 metadata files (this machine's), range requests read each
    # wheel's metadata instead of downloading some 10 GB of wheels; it changes how metadata is read, not the
    # resolution. A pip without the feature gets the same dry run without it
    proc = _pip("--use-feature=fast-deps", *args, timeout=900)
    if proc.returncode != 0 and "fast-deps" in proc.stderr and "ResolutionImpossible" not in proc.stderr:
        proc = _pip(*args, timeout=900)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        if "ResolutionImpossible" in proc.stderr or "conflicting dependencies" in proc.stderr:
            pytest.fail(f"`{INSTALL}` does not resolve from the public index ({seconds:.0f} s):\n{_tail(proc)}")
        if UNREACHABLE.search(proc.stdout + proc.stderr):
            _unreachable(proc)
        pytest.fail(f"the resolver dry run of `{INSTALL}` failed ({seconds:.0f} s):\n{_tail(proc)}")

    # bounded so that pip never backtracks (a torch range did, through seven torch releases)
    backtracked = [line.strip() for line in proc.stdout.splitlines() if "pip is looking at multiple versions" in line]
    assert not backtracked, f"`{INSTALL}` resolves only after backtracking ({seconds:.0f} s): {backtracked}"
    install = json.loads(report.read_text())["install"]
    resolved = {canonical(item["metadata"]["name"]): item["metadata"] for item in install}
    versions = {name: meta["version"] for name, meta in resolved.items()}
    majors = {name: cuda_major(name) for name in resolved if cuda_major(name) is not None}
    others = {f"{name} {versions[name]}": major for name, major in majors.items() if major != CUDA_MAJOR}
    assert not others, (
        f"`{INSTALL}` would install torch {versions.get('torch')} and packages for CUDA {sorted(set(others.values()))},"
        f" not {CUDA_MAJOR}: {others}"
    )
    missing = [name for name in GPU_STACK if name not in resolved]
    assert not missing, f"the dry run of `{INSTALL}` resolves no {missing}"
    # torch's own CUDA libraries: PyPI's torch names them through cuda-toolkit (or nvidia-*-cu13 wheels)
    torch_cuda = [d for d in resolved["torch"].get("requires_dist", []) if "cuda-toolkit" in d or "nvidia-" in d]
    assert torch_cuda, f"torch {versions['torch']} would be installed without CUDA libraries (a CPU build)"
    for dep in torch_cuda:
        toolkit = re.match(r"cuda-toolkit\b[^=]*==\s*(\d+)\.", dep)
        wheel = re.match(r"(nvidia-[a-z0-9-]+)", dep)
        major = int(toolkit.group(1)) if toolkit else cuda_major(wheel.group(1)) if wheel else None
        assert major in (None, CUDA_MAJOR), f"torch {versions['torch']} needs {dep}"
    if "cuda-toolkit" in versions:
        assert versions["cuda-toolkit"].startswith(f"{CUDA_MAJOR}."), versions["cuda-toolkit"]
    with capsys.disabled():
        names = (*GPU_STACK, "cuda-toolkit", "nvidia-nvjitlink", "dask", "distributed", "bokeh")
        shown = ", ".join(f"{n} {versions.get(n, '-')}" for n in names)
        print(f"\ncontract tier: `{INSTALL}` resolves from the public index ({seconds:.0f} s, pip {pip}): {shown}")

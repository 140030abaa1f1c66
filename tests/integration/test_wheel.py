"""The wheel works outside the checkout: built from the sources, installed (not editable) into a
fresh virtualenv, and run from a folder that has nothing of the repository in it.

An editable install hides packaging mistakes: it finds files beside the package (presets, data,
``../shared``) that a wheel does not carry. So the package is built with ``pip wheel``, installed
with ``pip install --no-deps`` into a new venv, and that venv borrows the test venv's dependencies
through a ``.pth`` file that lists the test venv's site-packages. A plain path line in a ``.pth``
does not run the other ``.pth`` files there (the editable install's finder among them), so
``rapids_attn`` can only come from the wheel; the tests check that it does. Offline and without
reinstalling torch: a few seconds to set up, then the real quickstart job (~40 s on 2 cores) and a
small job that extends built-in and job-local presets.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
import yaml
from helpers import REPO

#: what a job may take from the package: presets, the quickstart data, the pattern CNN's weights
#: a wheel built, a venv made and whole jobs run in it: minutes (the fast tier, -m "not slow", leaves it out)
pytestmark = pytest.mark.slow

PACKAGE_DATA = [
    "rapids_attn/presets/models/minilm-l6.yaml",
    "rapids_attn/presets/embedders/pooled.yaml",
    "rapids_attn/presets/clusters/kmeans.yaml",
    "rapids_attn/presets/data/quickstart.yaml",
    "rapids_attn/data/quickstart.json",
    "rapids_attn/patterns/weights/pattern_cnn.safetensors",
    "rapids_attn/patterns/weights/pattern_cnn.json",
]
#: code that runs from the checkout only and must not ship
NOT_SHIPPED = [
    "rapids_attn/bench/",
    "rapids_attn/patterns/train.py",
    "rapids_attn/patterns/evaluate.py",
    "rapids_attn/patterns/real_maps.py",
    "benchmarks/",
    "tools/",
    "configs/",
]


def _run(cmd: list, cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


class Installed:
    """A fresh venv with the wheel installed in it."""

    def __init__(self, root: Path, wheel: Path, python: Path):
        self.root, self.wheel, self.python = root, wheel, python
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH")}
        env["VIRTUAL_ENV"] = str(root)
        env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            OMP_WAIT_POLICY="PASSIVE",
            PIP_DISABLE_PIP_VERSION_CHECK="1",
        )
        self.env = env

    def run(self, *args, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
        return _run([self.python, *args], cwd=cwd, env=self.env, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    tmp = tmp_path_factory.mktemp("wheel")
    # build from a copy of the sources, so no stale build/ or egg-info of the checkout leaks into the
    # wheel and the checkout is not written to
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(
        REPO / "rapids_attn", src / "rapids_attn", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    )
    dist = tmp / "dist"
    p = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "-w",
            dist,
            src,
        ],
        cwd=tmp,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    (wheel,) = dist.glob("rapids_attn-*.whl")

    root = tmp / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(root)
    python = root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    # the test venv's pip installs into the fresh interpreter's environment (pip >= 22.3: --python)
    p = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            wheel,
        ],
        cwd=tmp,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    # then borrow every dependency from the test venv's site-packages, after the wheel's own
    site = Path(
        _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp).stdout.strip()
    )
    borrowed = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "zz_test_venv_dependencies.pth").write_text("".join(f"{d}\n" for d in borrowed))
    return Installed(root, wheel, python)


def test_wheel_carries_the_presets_and_data_and_nothing_of_the_checkout(installed):
    names = zipfile.ZipFile(installed.wheel).namelist()
    for name in PACKAGE_DATA:
        assert name in names, name
    for prefix in NOT_SHIPPED:
        assert not [n for n in names if n.startswith(prefix)], prefix
    assert {n.split("/")[0] for n in names} == {"rapids_attn", installed.wheel.name.split("-py")[0] + ".dist-info"}
    # nothing in the package reaches above its own folder through __file__
    for name in names:
        if name.endswith(".py"):
            text = zipfile.ZipFile(installed.wheel).read(name).decode()
            assert not re.search(r"__file__\)[^\n]*(\.parents\[|\.parent\.parent)", text), name
    # the README reads the outputs with pandas and xarray after a plain install: runtime dependencies
    meta = zipfile.ZipFile(installed.wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    required = {
        re.split(r"[\s<>=!~;\[]", line.split(":", 1)[1].strip())[0].lower()
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    }
    assert {"pandas", "xarray", "pyarrow"} <= required


def test_rapids_attn_imports_from_the_wheel_not_the_checkout(installed, tmp_path):
    p = installed.run(
        "-c",
        "import importlib.util as u, rapids_attn; print(rapids_attn.__file__); "
        "print(u.find_spec('rapids_attn.bench'), u.find_spec('benchmarks'), u.find_spec('tools'))",
        cwd=tmp_path,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    where, missing = p.stdout.splitlines()
    assert Path(where).resolve().is_relative_to(installed.root.resolve()), where
    assert missing == "None None None"


@pytest.mark.budget(90, reason="the real quickstart job on the installed wheel")
def test_quickstart_job_copied_anywhere_runs_on_the_wheel(installed, tmp_path):
    """The real quickstart: a copy of jobs/quickstart.yaml, its presets and data from the wheel."""
    work = tmp_path / "elsewhere"
    work.mkdir()
    shutil.copy2(REPO / "jobs" / "quickstart.yaml", work / "quickstart.yaml")
    # the relevance stage on 4 examples, not all 46: what ships for it is the same at any size (the explorer's
    # atlas below), and tests/integration/test_jobs.py runs the quickstart as the README does, at full size
    p = installed.run("-m", "rapids_attn.run", "quickstart.yaml", "--set", "relevance.examples=4", cwd=work)
    assert p.returncode == 0, p.stderr[-4000:]
    assert re.search(r"^done in [\d.]+s: 46 examples, 3,312 maps, 8 clusters", p.stdout, re.MULTILINE), p.stdout
    run = work / "runs" / "quickstart"
    for out in ("maps.parquet", "summary.json", "store.zarr/zarr.json", "report/index.html", "report/explorer.html"):
        assert (run / out).is_file(), out
    summary = json.loads((run / "summary.json").read_text())
    # the quickstart runs the relevance stage, so the explorer shows the head atlas (not the layer x head grid)
    assert (
        summary["explorer"]["maps"] == 3312
        and "Jensen-Shannon distance, MDS" in (run / "report/explorer.html").read_text()
    )
    # the data came from inside the installed package, through the data/quickstart preset: the run's job.yaml keeps
    # where it was read; summary.json, which is shared, names the file alone (issue 47)
    assert summary["data"]["path"] == "quickstart.json"
    data = Path(yaml.safe_load((run / "job.yaml").read_text())["data"]["path"])
    assert data.name == "quickstart.json" and data.is_relative_to(installed.root.resolve()), data
    # the README's snippet reads the outputs
    snippet = (
        "import pandas as pd, xarray as xr\n"
        "maps = pd.read_parquet('runs/quickstart/maps.parquet')\n"
        "per_head = maps.groupby(['layer', 'head']).cluster.agg(lambda c: c.mode()[0]).unstack()\n"
        "ds = xr.open_zarr('runs/quickstart/store.zarr')\n"
        "print(per_head.shape, ds.sizes['example'])\n"
    )
    p = installed.run("-c", snippet, cwd=work, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["(6,", "12)", "46"]


@pytest.mark.budget(40, reason="a job through the CLI on the installed wheel")
def test_job_extends_builtin_presets_and_its_own_configs_folder(installed, tmp_path):
    """A project folder with its own configs/ (found from jobs/, one level down) and its own data,
    named by a relative path in its preset; built-in presets for the model, embedder and clusterer.
    Run from yet another folder, so nothing resolves against the working directory."""
    project = tmp_path / "project"
    (project / "configs" / "local").mkdir(parents=True)
    (project / "jobs").mkdir()
    (project / "data").mkdir()
    shutil.copy2(REPO / "rapids_attn" / "data" / "quickstart.json", project / "data" / "questions.json")
    (project / "configs" / "local" / "tiny.yaml").write_text(
        "# relative to this preset file\n"
        "data: {path: ../../data/questions.json, format: squad}\n"
        "extract: {shard_size: 3, thumbnail_size: 8}\n"
        "cluster: {n_clusters: 3, k_sweep: null}\n"
    )
    (project / "jobs" / "tiny.yaml").write_text(
        "name: tiny\n"
        "extends: [models/minilm-l6, embedders/pooled, clusters/kmeans, local/tiny]\n"
        "explain: {head_views: 0, permutations: 0}\n"
        "runtime: {n_workers: 1, processes: false, learn_backend: cpu}\n"
    )
    cwd = tmp_path / "somewhere-else"
    cwd.mkdir()
    p = installed.run(
        "-m",
        "rapids_attn.run",
        project / "jobs" / "tiny.yaml",
        "--set",
        "data.limit=6",
        "--set",
        "output.dir=out/tiny",
        cwd=cwd,
    )
    assert p.returncode == 0, p.stderr[-4000:]
    assert re.search(r"^done in [\d.]+s: 6 examples, 432 maps, 3 clusters", p.stdout, re.MULTILINE), p.stdout
    run = cwd / "out" / "tiny"
    for out in ("maps.parquet", "summary.json", "store.zarr/zarr.json", "report/index.html"):
        assert (run / out).is_file(), out
    summary = json.loads((run / "summary.json").read_text())
    job = yaml.safe_load((run / "job.yaml").read_text())
    assert Path(job["data"]["path"]) == (project / "data" / "questions.json").resolve()
    assert summary["data"]["path"] == "questions.json"  # summary.json is shared: the file's name alone
    assert summary["clusters"]["n_clusters"] == 3  # from the job-local preset
    import zarr

    features = zarr.open_group(str(run / "store.zarr"), mode="r")["features"]
    assert features.shape == (6, 6, 12, 256)  # MiniLM's 6 x 12 heads, pooled 16 x 16 (built-in presets)

#!/usr/bin/env bash
# The contract tier: every GPU call the project makes (cuML estimators, cuml.dask, dask-cuda's
# LocalCUDACluster, RMM's allocator hooks, zarr's GPU mode), checked against the real RAPIDS wheels
# of the release docker/Dockerfile uses, on a machine without a GPU: the wheels import, signatures
# bind and estimators construct there; only fitting needs a GPU.
#
# Its own virtualenv (.venv-rapids, or $RAPIDS_CONTRACT_VENV), made from scratch each run: the RAPIDS
# wheels (CUDA 12) cannot share one with PyPI's torch (CUDA 13). About 1.5 GB of wheels.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${RAPIDS_CONTRACT_VENV:-.venv-rapids}
start=$SECONDS
python3 -m venv --clear "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
mapfile -t reqs < <(python tests/contract/requirements.py)
pip install -q "${reqs[@]}"
pip install -q --no-deps -e .
echo "contract tier: environment ready in $((SECONDS - start)) s"
# --confcutdir: tests/conftest.py (tiny models, torch) belongs to the main tier
python -m pytest -q -ra -p no:cacheprovider --confcutdir=tests/contract tests/contract
echo "contract tier: done in $((SECONDS - start)) s"

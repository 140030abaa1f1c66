#!/usr/bin/env bash
# The contract tier: every GPU call the project makes (cuML estimators, cuml.dask, dask-cuda's
# LocalCUDACluster, RMM's allocator hooks, zarr's GPU mode), checked against the real RAPIDS wheels
# of the release docker/Dockerfile uses, on a machine without a GPU: the wheels import, signatures
# bind and estimators construct there; only fitting needs a GPU. In the same venv, a resolver dry run
# of the documented GPU install (`pip install -e '.[gpu]'`: torch, CuPy and RAPIDS, all CUDA 13) against
# the public index alone must succeed with one CUDA major (tests/contract/test_gpu_install.py, about a
# minute). It needs the index: where it cannot be reached the tier fails, saying so; on a machine that
# is offline on purpose, RAPIDS_CONTRACT_OFFLINE=1 skips that one test (shown as skipped, with why).
#
# Its own virtualenv, without torch (tests/contract/requirements.py says why). About 5 GB installed,
# so it is built once per key and reused while the key is unchanged: the key hashes
# the requirement list tests/contract/requirements.py prints, the Python that builds it and the
# install recipe below (build_venv). It lives outside the checkout, in
#   ${RAPIDS_ATTN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rapids_attn}/contract-venv-<key>
# (entries of other keys are removed), or in $RAPIDS_CONTRACT_VENV where that is set (rebuilt there
# whenever its key differs). RAPIDS_CONTRACT_REBUILD=1 rebuilds it whatever its key.
# A venv is reused only when its stamp (written last, after the checks passed) names the key, every
# requirement is installed at a version it allows and the RAPIDS modules import; otherwise it is
# rebuilt, so an interrupted or broken build is never reused. The ranges (>=) are resolved when the
# venv is built: a reused venv keeps the versions it got then.
#
# The project is not installed into it (the venv is shared by every clone on the machine): the tests
# import this checkout's rapids_attn through PYTHONPATH, and the run fails unless they did.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
start=$SECONDS

cache=${RAPIDS_ATTN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rapids_attn}
mkdir -p "$cache"

mapfile -t reqs < <(python3 tests/contract/requirements.py)
((${#reqs[@]})) || { echo "contract tier: tests/contract/requirements.py printed no requirements" >&2; exit 1; }

# the install recipe: part of the key, so a change here rebuilds the venv. pip first: the resolver
# dry run needs pip 25.1 or newer (older ones back off through cuda-toolkit versions: docs/install.md)
build_venv() {
    python3 -m venv --clear "$1"
    "$1/bin/python" -m pip install -q --upgrade "pip>=25.1"
    "$1/bin/python" -m pip install -q "${@:2}"
}

key=$(
    {
        printf '%s\n' "${reqs[@]}"
        python3 -c 'import os, platform, sys; print(sys.version, os.path.realpath(sys.base_prefix), platform.machine())'
        declare -f build_venv
    } | sha256sum | cut -c1-16
)

if [[ -n ${RAPIDS_CONTRACT_VENV:-} ]]; then
    venv=$(realpath -m "$RAPIDS_CONTRACT_VENV")
    evict=0
else
    venv=$cache/contract-venv-$key
    evict=1
fi
stamp=$venv/.contract-tier-complete
py=$venv/bin/python

# complete: every requirement installed at a version it allows, the RAPIDS modules (and pytest)
# import; reused only when also stamped with this key (the stamp is written last, after this check)
check_contents() {
    "$py" - "${reqs[@]}" <<'EOF'
import importlib, importlib.metadata as md, sys

try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement

try:
    for line in sys.argv[1:]:
        req = Requirement(line)
        version = md.version(req.name)
        if not req.specifier.contains(version, prereleases=True):
            sys.exit(f"contract tier: {req.name} {version} does not satisfy {line}")
    for module in ("cuml", "cuml.dask", "dask_cuda", "rmm", "cupy", "pytest"):
        importlib.import_module(module)
    if not Requirement("pip>=25.1").specifier.contains(md.version("pip")):  # the resolver dry run's
        sys.exit(f"contract tier: pip {md.version('pip')} is older than 25.1")
except Exception as e:  # a missing distribution, a module that no longer imports
    sys.exit(f"contract tier: the venv fails its check: {e!r}")
EOF
}
check_venv() {
    [[ -x $py && -f $stamp && $(cat "$stamp") == "$key" ]] && check_contents
}

# The cache is shared by every clone on the machine. A run that reuses the venv holds a shared lock
# until its tests end; building, rebuilding or removing a venv takes the exclusive lock, so it waits
# for the runs using one, and no run sees a venv half built or half removed
stale_entries() {
    local old
    ((evict)) || return 0
    for old in "$cache"/contract-venv-*; do
        [[ -e $old && $old != "$venv" ]] && echo "$old"
    done
    return 0
}
usable() { [[ ${RAPIDS_CONTRACT_REBUILD:-0} != 1 ]] && check_venv; }

exec 9>"$cache/lock"
flock -s 9
if [[ -z $(stale_entries) ]] && usable; then
    what=reused
else
    flock -u 9
    flock -x 9
    # first, so that the disk holds one venv at a time (6.8 GB), not two while the new one builds
    stale_entries | while read -r old; do
        echo "contract tier: removing $old (another key)"
        rm -rf "$old"
    done
    if usable; then # built by another run meanwhile
        what=reused
    else
        [[ -e $venv ]] && echo "contract tier: rebuilding $venv (missing its stamp, stale or incomplete)"
        rm -f "$stamp"
        build_venv "$venv" "${reqs[@]}"
        "$py" -m pip freeze --all >"$venv/contract-tier-freeze.txt"
        check_contents || exit 1
        echo "$key" >"$stamp.tmp" && mv "$stamp.tmp" "$stamp"
        what=built
    fi
    flock -s 9
fi
echo "contract tier: environment $what (key $key, $venv) in $((SECONDS - start)) s"

# --confcutdir: tests/conftest.py (tiny models, torch) belongs to the main tier. Run in-process so
# that the rapids_attn the tests imported can be checked: this checkout's, and imported at all (a
# module-level skip would otherwise pass the tier without running anything)
tests=$SECONDS
PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} "$py" - "$root" <<'EOF'
import sys
from pathlib import Path

import pytest

root = Path(sys.argv[1]).resolve()
rc = int(pytest.main(["-q", "-ra", "-p", "no:cacheprovider", "--confcutdir=tests/contract", "tests/contract"]))
module = sys.modules.get("rapids_attn")
if module is None:
    sys.exit(rc or "contract tier: the tests never imported rapids_attn")
where = Path(module.__file__).resolve()
print(f"contract tier: rapids_attn from {where}")
if not where.is_relative_to(root):
    sys.exit(f"contract tier: rapids_attn was not imported from this checkout ({root})")
sys.exit(rc)
EOF
echo "contract tier: tests in $((SECONDS - tests)) s; done in $((SECONDS - start)) s"

#!/usr/bin/env bash
# The consumer tier: the files rapids_attn.kvheads.formats writes, loaded by the consumers' own code
# (kvpress's DuoAttentionPress on a tiny Llama; readers that mirror vLLM / MInference and HeadKV).
#
# Its own virtualenv (kvpress pins transformers<5.3, which the project's .venv must not get), built
# from tests/consumers/requirements.txt once per key and reused while the key is unchanged: the key
# hashes the requirements, the Python that builds it and the recipe (build_venv). It lives in
#   ${RAPIDS_ATTN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rapids_attn}/consumer-venv-<key>
# (entries of other keys are removed when one is built). RAPIDS_CONSUMER_REBUILD=1 rebuilds it.
# RAPIDS_CONSUMER_EXTRA adds requirements (part of the key), e.g. a CPU torch wheel a local
# mirror holds: RAPIDS_CONSUMER_EXTRA='torch==2.13.0+cpu'. A venv is reused only when its stamp,
# written last after its imports passed, names the key, so a broken build is never reused.
#
# The project is not installed into it: the tests import this checkout's rapids_attn through
# PYTHONPATH, and the run fails unless they did.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
start=$SECONDS

cache=${RAPIDS_ATTN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rapids_attn}
mkdir -p "$cache"

mapfile -t reqs < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' tests/consumers/requirements.txt | grep -v '^$')
# shellcheck disable=SC2206 # word-split on purpose: a list of requirements
reqs+=(${RAPIDS_CONSUMER_EXTRA:-})

# the install recipe: part of the key, so a change here rebuilds the venv
build_venv() {
    python3 -m venv --clear "$1"
    "$1/bin/python" -m pip install -q "${@:2}"
}

key=$(
    {
        printf '%s\n' "${reqs[@]}"
        python3 -c 'import os, platform, sys; print(sys.version, os.path.realpath(sys.base_prefix), platform.machine())'
        declare -f build_venv
    } | sha256sum | cut -c1-16
)
venv=$cache/consumer-venv-$key
stamp=$venv/.consumer-tier-complete
py=$venv/bin/python

usable() { [[ ${RAPIDS_CONSUMER_REBUILD:-0} != 1 && -x $py && -f $stamp && $(cat "$stamp") == "$key" ]]; }

# shared by every clone on the machine: a run holds the shared lock while it uses the venv; building
# (and removing other keys' venvs) takes the exclusive lock, so no run sees a venv half built or removed
exec 9>"$cache/consumer-lock"
flock -s 9
if usable; then
    what=reused
else
    flock -u 9
    flock -x 9
    for old in "$cache"/consumer-venv-*; do
        [[ -e $old && $old != "$venv" ]] && echo "consumer tier: removing $old (another key)" && rm -rf "$old"
    done
    if usable; then # built by another run meanwhile
        what=reused
    else
        echo "consumer tier: building $venv"
        rm -f "$stamp"
        build_venv "$venv" "${reqs[@]}"
        "$py" -m pip freeze --all >"$venv/consumer-tier-freeze.txt"
        "$py" -c 'import kvpress, numpy, pytest, torch, transformers' || {
            echo "consumer tier: the new venv fails to import its requirements" >&2
            exit 1
        }
        echo "$key" >"$stamp.tmp" && mv "$stamp.tmp" "$stamp"
        what=built
    fi
    flock -s 9
fi
echo "consumer tier: environment $what (key $key, $venv, $(du -sh "$venv" | cut -f1)) in $((SECONDS - start)) s"

# In-process, so that the rapids_attn the tests imported can be checked: this checkout's, and imported
# at all (a module-level skip would otherwise pass the tier without running anything). --confcutdir
# keeps tests/conftest.py (the main tier's fixtures) out
tests=$SECONDS
RAPIDS_ATTN_CONSUMER_TIER=1 PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} "$py" - "$root" "$@" <<'PY'
import sys
from pathlib import Path

import pytest

root = Path(sys.argv[1]).resolve()
args = ["-q", "-ra", "-p", "no:cacheprovider", "--confcutdir=tests/consumers", "tests/consumers", *sys.argv[2:]]
rc = int(pytest.main(args))
module = sys.modules.get("rapids_attn")
if module is None:
    sys.exit(rc or "consumer tier: the tests never imported rapids_attn")
where = Path(module.__file__).resolve()
print(f"consumer tier: rapids_attn from {where}")
if not where.is_relative_to(root):
    sys.exit(f"consumer tier: rapids_attn was not imported from this checkout ({root})")
sys.exit(rc)
PY
echo "consumer tier: tests in $((SECONDS - tests)) s; done in $((SECONDS - start)) s"

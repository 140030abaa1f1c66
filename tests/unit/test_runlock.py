"""One run per run directory: a second run on a held directory exits 2 in one line, naming the holder."""

import os
import subprocess
import sys
from pathlib import Path

import yaml
from helpers import make_job

from rapids_attn.run import main
from rapids_attn.runlock import LOCK_NAME, run_lock


def _job(tmp_path, tiny_bert_dir, pair_data):
    job = make_job(tmp_path, tiny_bert_dir, pair_data)
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(job))
    return p, job


def test_a_second_run_on_a_held_directory_exits_2_naming_the_holder(tmp_path, capsys, tiny_bert_dir, pair_data):
    p, job = _job(tmp_path, tiny_bert_dir, pair_data)
    run_dir = Path(job["output"]["dir"])
    with run_lock(run_dir):
        assert main([str(p)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith("error: output.dir:")
        assert f"pid {os.getpid()}" in err and "in use by another run" in err
        assert not (run_dir / "job.yaml").exists() and not (run_dir / "store.zarr").exists()
    assert main([str(p), "--check"]) == 0  # --check takes no lock and writes nothing


def test_the_lock_dies_with_its_holder(tmp_path):
    """A holder killed with -9 leaves the lock file but not the lock: the next run gets it."""
    run_dir = tmp_path / "run"
    code = (
        "import time\nfrom rapids_attn.runlock import run_lock\n"
        f"with run_lock({str(run_dir)!r}):\n    print('held', flush=True)\n    time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert (run_dir / LOCK_NAME).read_text().strip() == str(holder.pid)
    finally:
        holder.kill()
        holder.wait()
    with run_lock(run_dir):
        assert (run_dir / LOCK_NAME).read_text().strip() == str(os.getpid())

"""rapids_attn.processes: the process machinery in one place, each piece switched off by name for its measurement
(``RAPIDS_ATTN_WITHOUT``), and a name that is no piece refused in one line."""

from types import SimpleNamespace

import pytest
import yaml
from helpers import make_job

from rapids_attn import processes
from rapids_attn.errors import UserError
from rapids_attn.job import ClusterConfig, ReduceConfig, RuntimeConfig
from rapids_attn.registry import registered_stages


def test_every_piece_is_on_unless_named(monkeypatch):
    monkeypatch.delenv(processes.WITHOUT_ENV, raising=False)
    assert processes.turned_off() == frozenset() and all(processes.enabled(p) for p in processes.PIECES)
    monkeypatch.setenv(processes.WITHOUT_ENV, " fork-server, malloc-env ,")
    assert processes.turned_off() == {"fork-server", "malloc-env"}
    assert not processes.enabled("fork-server") and processes.enabled("quick-exit")
    with pytest.raises(ValueError, match="no process piece named 'forks'"):
        processes.enabled("forks")


def test_a_name_that_is_no_piece_is_one_line_and_exit_2(monkeypatch, tmp_path, tiny_bert_dir, pair_data, capsys):
    from rapids_attn.run import main

    monkeypatch.setenv(processes.WITHOUT_ENV, "fork-server,warm")
    with pytest.raises(UserError, match="RAPIDS_ATTN_WITHOUT: no piece named warm; the pieces are fork-server, "):
        processes.turned_off()
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(make_job(tmp_path, tiny_bert_dir, pair_data)))
    assert main([str(job)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: RAPIDS_ATTN_WITHOUT: no piece named warm")
    assert not (tmp_path / "run").exists()  # refused before the run directory is touched


def test_each_piece_off_is_what_it_names(monkeypatch):
    monkeypatch.setenv(processes.WITHOUT_ENV, "")
    local = RuntimeConfig(processes=True)
    assert processes.worker_modules(registered_stages().values())[-1] == "rapids_attn._fork_ready"
    assert "MALLOC_TRIM_THRESHOLD_" not in processes.worker_env()

    monkeypatch.setenv(processes.WITHOUT_ENV, "server-freeze,malloc-env,fork-server,quick-exit")
    assert "rapids_attn._fork_ready" not in processes.worker_modules(
        registered_stages().values()
    )  # the server neither freezes nor skips teardown
    assert processes.worker_env()["MALLOC_TRIM_THRESHOLD_"] == "65536"  # distributed's own setting
    assert processes.start_worker_server(local) is False  # the workers are spawned
    assert processes.exit_without_teardown({"code": 0}) is None  # returns: the interpreter's own exit follows


def test_kmeans_extra_fits_run_in_the_job_process():
    """learn-on-workers was measured and removed: a CPU fit with a k sweep and stability refits keeps no cluster."""
    from rapids_attn.learn.stage import LearnStage

    ctx = SimpleNamespace(
        stages=("extract", "learn"), devices=SimpleNamespace(learn=SimpleNamespace(gpu=False), multi_gpu_learn=False)
    )
    cluster = ClusterConfig(method="kmeans", k_sweep=[2, 3], stability_seeds=2)
    assert LearnStage(ReduceConfig(), cluster, cluster_kind="local").uses_cluster(ctx) is False
    assert "learn-on-workers" not in processes.PIECES and "warm-next" not in processes.PIECES

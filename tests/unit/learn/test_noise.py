"""A density fit that leaves every map (or most of them) as noise: the run goes on, and says so."""

from types import SimpleNamespace

import pytest
from helpers import E, H, L, learn, learn_sections, planted_store

from rapids_attn.devices import resolve_learn_backend
from rapids_attn.job import ClusterConfig
from rapids_attn.learn.fit import noise_warnings
from rapids_attn.learn.stage import LearnStage
from rapids_attn.store.zarr_store import mark_complete

N = E * L * H  # 360 maps


def test_hdbscan_all_noise_is_warned_in_the_result_and_the_store(tmp_path):
    g, _ = planted_store(tmp_path)
    info = learn(g, **{"cluster.method": "hdbscan", "cluster.min_cluster_size": N + 100})  # more than the maps
    assert info["n_clusters"] == 0 and info["noise_share"] == 1.0
    assert info["cluster_sizes"] == {"-1": N}
    fix = f"lower cluster.min_cluster_size (now {N + 100}) or cluster.min_samples (now 5), or use kmeans"
    assert info["warnings"] == [f"cluster.hdbscan marked all {N} maps as noise (no clusters); {fix}"]
    assert g.attrs["learn"]["warnings"] == info["warnings"]  # explain reads them from the store


def test_dbscan_all_noise_names_eps(tmp_path):
    g, _ = planted_store(tmp_path)
    info = learn(g, **{"cluster.method": "dbscan", "cluster.eps": 1e-4, "cluster.min_samples": 3})
    assert info["noise_share"] == 1.0
    (w,) = info["warnings"]
    assert w.startswith(f"cluster.dbscan marked all {N} maps as noise") and "raise cluster.eps (now 0.0001)" in w


def test_clean_density_fit_has_no_warning(tmp_path):
    g, _ = planted_store(tmp_path)
    info = learn(g, **{"cluster.method": "hdbscan", "cluster.min_cluster_size": 10, "cluster.min_samples": 3})
    assert info["n_clusters"] == 3 and info["warnings"] == []


@pytest.mark.parametrize(
    "method, counts, expected",
    [
        ("hdbscan", {-1: 180, 0: 180}, None),  # half: no warning
        ("hdbscan", {-1: 250, 0: 110}, "cluster.hdbscan marked 250 of 360 maps (69%) as noise; the clusters"),
        ("dbscan", {-1: 1500, 0: 500}, "cluster.dbscan marked 1,500 of 2,000 maps (75%) as noise;"),
        ("kmeans", {0: 360}, None),
    ],
)
def test_high_noise_share_gets_a_softer_warning(method, counts, expected):
    cluster = ClusterConfig(method=method)
    got = noise_warnings(cluster, counts, sum(counts.values()))
    if expected is None:
        assert got == []
    else:
        (w,) = got
        assert w.startswith(expected) and "describe only the rest" in w and "no clusters" not in w


def test_learn_stage_prints_the_warning_once_on_stderr(tmp_path, capsys):
    g, _ = planted_store(tmp_path)
    mark_complete(g, "extract", True)
    reduce, cluster = learn_sections(**{"cluster.method": "hdbscan", "cluster.min_cluster_size": N + 1})
    ctx = SimpleNamespace(
        store_path=tmp_path / "store.zarr",
        devices=SimpleNamespace(learn=resolve_learn_backend("cpu"), multi_gpu_learn=False),
    )
    result = LearnStage(reduce, cluster).run(ctx)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning:")]
    assert lines == [f"warning: {result.info['warnings'][0]}"]
    assert "all 360 maps as noise" in lines[0]
    assert result.to_dict()["warnings"] == result.info["warnings"]

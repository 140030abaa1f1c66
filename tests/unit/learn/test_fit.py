"""The learn stage on planted clusters written straight into a store (no model involved)."""

import numpy as np
import pytest
from helpers import E, H, L, learn, planted_store
from sklearn.metrics import adjusted_rand_score

from rapids_attn.devices import resolve_learn_backend
from rapids_attn.errors import BackendUnavailableError


def test_kmeans_recovers_planted_clusters_from_a_sample(tmp_path):
    g, truth = planted_store(tmp_path)
    info = learn(g, **{"reduce.fit_sample": 100})
    labels = g["cluster"][:].reshape(-1)
    assert info["n_fit"] == 100 and info["n_maps"] == E * L * H
    assert adjusted_rand_score(truth, labels) == pytest.approx(1.0)
    assert info["silhouette"] > 0.8
    assert g["coords"].shape == (E, L, H, 2) and g["reduced"].shape == (E, L, H, 4)
    assert g.attrs["learn_complete"] is True


def test_seeded_fit_is_repeatable(tmp_path):
    g, _ = planted_store(tmp_path)
    learn(g, **{"reduce.fit_sample": 50})
    first = g["cluster"][:].copy(), g["coords"][:].copy()
    learn(g, **{"reduce.fit_sample": 50})
    np.testing.assert_array_equal(first[0], g["cluster"][:])
    np.testing.assert_array_equal(first[1], g["coords"][:])


@pytest.mark.parametrize(
    "method, params",
    [
        ("dbscan", {"cluster.eps": 2.0, "cluster.min_samples": 3}),
        ("hdbscan", {"cluster.min_cluster_size": 10, "cluster.min_samples": 3}),
    ],
)
def test_density_methods_assign_every_map(tmp_path, method, params):
    g, truth = planted_store(tmp_path)
    info = learn(g, **{"cluster.method": method, "reduce.fit_sample": 200, **params})
    labels = g["cluster"][:].reshape(-1)
    assert info["n_fit"] == 200
    assert info["n_clusters"] == 3
    assert 0 <= info["noise_share"] < 0.05
    keep = labels >= 0
    assert adjusted_rand_score(truth[keep], labels[keep]) == pytest.approx(1.0)


@pytest.mark.slow  # numba compiles UMAP on its first use: 40 s or more in a fresh process, 137 s on a loaded host
@pytest.mark.budget(60, reason="numba compiles UMAP on its first use in a process")
def test_umap_coordinates(tmp_path):
    g, truth = planted_store(tmp_path)
    info = learn(g, **{"reduce.umap.enabled": True, "reduce.umap.n_neighbors": 10})
    assert info["umap"] is True
    assert adjusted_rand_score(truth, g["cluster"][:].reshape(-1)) == pytest.approx(1.0)
    assert np.isfinite(g["coords"][:]).all()


def test_gpu_backend_without_gpu_is_a_user_error():
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is visible here")
    except ImportError:
        pass
    with pytest.raises(BackendUnavailableError, match="runtime.learn_backend: gpu requested but"):
        resolve_learn_backend("gpu")
    assert resolve_learn_backend("auto").name == "sklearn"


def test_k_sweep_and_auto_pick_the_planted_k(tmp_path):
    g, _truth = planted_store(tmp_path)
    info = learn(g, **{"cluster.n_clusters": "auto", "cluster.k_sweep": "[2, 6]"})
    sweep = info["k_sweep"]
    assert sweep["k"] == [2, 3, 4, 5, 6]
    assert sweep["chosen"] == sweep["best_silhouette_k"] == 3
    assert all(a >= b for a, b in zip(sweep["inertia"], sweep["inertia"][1:]))  # inertia falls with k
    assert info["n_clusters"] == 3


def test_group_balanced_fit_sample():
    from rapids_attn.learn.storeio import sample_maps as _sample_maps

    groups = np.array([0] * 90 + [1] * 5 + [2] * 5)  # one group with 90% of the examples
    idx = _sample_maps(100 * 4, 60, 0, groups, maps_per_example=4)
    picked = np.bincount(groups[idx // 4], minlength=3)
    assert len(idx) == 60 and len(set(idx.tolist())) == 60
    assert picked.tolist() == [20, 20, 20]  # equal shares, not 54 / 3 / 3
    small = _sample_maps(100 * 4, 100, 0, np.array([0] * 98 + [1] * 2), maps_per_example=4)
    assert np.bincount(np.array([0] * 98 + [1] * 2)[small // 4]).tolist() == [92, 8]  # small group gives all it has

"""KMeans's dependence on its seed, measured and reported: the fit's labels against refits with other
seeds (ARI), and the k sweep's auto pick preferring the k whose clusters do not move with the seed."""

import numpy as np
import pytest
from helpers import learn, planted_store
from sklearn.metrics import adjusted_rand_score

import rapids_attn.learn.fit as fit_mod
from rapids_attn.devices import resolve_learn_backend


def test_well_separated_clusters_are_stable_and_say_so(tmp_path):
    g, _ = planted_store(tmp_path)
    info = learn(g, **{"cluster.stability_seeds": 3, "cluster.k_sweep": None})
    st = info["stability"]
    assert st["seeds"] == [1, 2, 3] and st["n_fit"] == info["n_fit"]
    assert st["ari"] == [1.0, 1.0, 1.0] and st["min_ari"] == 1.0
    assert dict(g.attrs["learn"])["stability"] == st  # kept with the store, for summary.json


def test_the_figure_is_the_ari_of_real_refits(tmp_path):
    """Overlapping blobs: the refits disagree a little, and the figure is exactly their ARI."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(400, 3))
    backend = resolve_learn_backend("cpu")
    labels = backend.kmeans(7, 0).fit_predict(z)
    got = fit_mod.seed_agreement(backend, z, labels, 7, [5, 6])
    want = [adjusted_rand_score(labels, backend.kmeans(7, s).fit_predict(z)) for s in (5, 6)]
    assert got == pytest.approx(want, abs=1e-4) and min(got) < 1.0


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"cluster.stability_seeds": 0}, "skipped"),
        ({"cluster.method": "dbscan", "cluster.eps": 3.0, "cluster.k_sweep": None}, "deterministic"),
    ],
)
def test_no_figure_when_skipped_or_deterministic(tmp_path, overrides, why):
    g, _ = planted_store(tmp_path)
    assert learn(g, **overrides)["stability"] is None, why


def test_auto_prefers_the_best_silhouette_among_stable_k(tmp_path, monkeypatch):
    g, _ = planted_store(tmp_path)
    info = learn(g, **{"cluster.n_clusters": "auto", "cluster.k_sweep": [2, 6]})
    sweep = info["k_sweep"]
    assert sweep["chosen"] == 3 and len(sweep["stability"]) == len(sweep["k"])  # the planted k, stable
    real = fit_mod.seed_agreement

    def k3_unstable(backend, z, labels, k, seeds):
        return [0.5] if k == 3 else real(backend, z, labels, k, seeds)

    monkeypatch.setattr(fit_mod, "seed_agreement", k3_unstable)
    info = learn(g, **{"cluster.n_clusters": "auto", "cluster.k_sweep": [2, 6]})
    sweep = info["k_sweep"]
    stable = [(s, k) for k, s, a in zip(sweep["k"], sweep["silhouette"], sweep["stability"]) if a >= 0.9]
    assert sweep["chosen"] != 3 and sweep["chosen"] == max(stable)[1]

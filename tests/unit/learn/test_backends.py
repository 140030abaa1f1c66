"""A learn backend is one library class registered in one place (``backends.learn.LIBRARIES``, issue 36): the
learn stage's fit reaches every estimator and read through it, and a backend travels to the workers by name."""

import pickle
from typing import ClassVar

import numpy as np
import pytest
from helpers import learn_sections, planted_store

from rapids_attn.backends import learn as B
from rapids_attn.backends.learn import LearnBackend, ScikitLearn
from rapids_attn.errors import BackendUnavailableError
from rapids_attn.learn.fit import fit_store
from rapids_attn.store import schema as S


class Counting(ScikitLearn):
    """scikit-learn, counting what the fit asks of it."""

    calls: ClassVar[list] = []

    @staticmethod
    def pca(n_components, seed):
        Counting.calls.append("pca")
        return ScikitLearn.pca(n_components, seed)

    @staticmethod
    def kmeans(n_clusters, seed):
        Counting.calls.append("kmeans")
        return ScikitLearn.kmeans(n_clusters, seed)

    @staticmethod
    def read(array, sl, xp):
        Counting.calls.append("read")
        return ScikitLearn.read(array, sl, xp)


def test_a_backend_registered_once_is_the_fit_s_whole_backend(tmp_path, monkeypatch):
    monkeypatch.setitem(B.LIBRARIES, "counting", Counting)
    monkeypatch.setattr(Counting, "calls", [])
    g, _ = planted_store(tmp_path)
    reduce, cluster = learn_sections(**{"cluster.k_sweep": None, "cluster.stability_seeds": 0})
    backend = LearnBackend("counting", "test")
    assert not backend.gpu and pickle.loads(pickle.dumps(backend)).library is Counting
    info = fit_store(g, reduce, cluster, backend, seed=0)
    assert info["backend"] == "counting"
    assert Counting.calls.count("pca") == 1 and Counting.calls.count("kmeans") == 1
    assert Counting.calls.count("read") == -(-g[S.FEATURES].shape[0] // g[S.FEATURES].chunks[0]) * 2  # sample + assign
    want = fit_store(planted_store(tmp_path / "again")[0], reduce, cluster, LearnBackend("sklearn", "t"), seed=0)
    assert info["cluster_sizes"] == want["cluster_sizes"]


def test_the_libraries_keep_their_sides():
    assert not B.LIBRARIES["sklearn"].gpu and B.LIBRARIES["cuml"].gpu
    assert LearnBackend("sklearn", "t").xp is np
    with pytest.raises(BackendUnavailableError, match="multi-GPU KMeans needs cuML"):
        LearnBackend("sklearn", "t").dask_kmeans(None, 3, 0)

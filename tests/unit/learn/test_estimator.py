"""MapClusterer is a scikit-learn estimator (issue 48): flat keyword parameters stored as given, get_params /
set_params / clone, GridSearchCV and Pipeline, a subset of scikit-learn's own estimator checks, the parameters
checked by fit with the job's rules, and from_config equal to the flat form, fit for fit."""

import io
import logging
import pickle
import re

import numpy as np
import pytest
from helpers import learn_sections, planted_store
from sklearn import base
from sklearn.datasets import make_blobs
from sklearn.metrics import adjusted_rand_score
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils import estimator_checks as checks

import rapids_attn
from rapids_attn.backends import LearnBackend
from rapids_attn.errors import BackendUnavailableError, UserError
from rapids_attn.learn import MapClusterer
from rapids_attn.learn.config import ClusterConfig, ReduceConfig, UmapConfig
from rapids_attn.learn.estimator import InvalidParameterError
from rapids_attn.learn.fit import fit_store
from rapids_attn.learn.progress import stage_lines

#: quick settings: no k sweep, no stability refits
QUICK = {"k_sweep": None, "stability_seeds": 0, "n_clusters": 3, "pca_components": 2}


@pytest.fixture(scope="module")
def blobs():
    x, y = make_blobs(n_samples=90, centers=3, n_features=6, cluster_std=0.4, random_state=3)
    return x.astype(np.float32), y


def test_exported_from_the_package_and_learn():
    assert rapids_attn.MapClusterer is MapClusterer
    assert "MapClusterer" in rapids_attn.__all__ and "MapClusterer" in rapids_attn.learn.__all__
    assert isinstance(MapClusterer(), base.BaseEstimator)
    assert base.is_clusterer(MapClusterer())
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        rapids_attn.Nope  # noqa: B018


def test_params_round_trip_and_clone():
    est = MapClusterer(method="hdbscan", min_cluster_size=7, umap=True, n_neighbors=9, random_state=4)
    params = est.get_params()
    assert params["method"] == "hdbscan" and params["n_neighbors"] == 9 and params["random_state"] == 4
    assert params["backend"] == "cpu" and params["k_sweep"] == (2, 16)  # the job's defaults
    again = MapClusterer(**params)
    assert again.get_params() == params
    twin = base.clone(est)
    assert twin is not est and twin.get_params() == params
    assert est.set_params(min_cluster_size=11, method="dbscan") is est
    assert est.get_params()["min_cluster_size"] == 11 and est.method == "dbscan"
    with pytest.raises(ValueError, match="Invalid parameter 'nope'"):
        est.set_params(nope=1)
    with pytest.raises(TypeError):
        MapClusterer(4)  # keyword parameters only


def test_every_setting_of_the_sections_is_a_parameter():
    """A field added to the job's reduce.umap or cluster sections is a parameter too (or from_config drops it)."""
    names = set(MapClusterer().get_params())
    assert set(ClusterConfig.model_fields) <= names
    assert {"pca_components", "umap", "umap_components", "random_state", "backend"} <= names
    assert set(UmapConfig.model_fields) - {"enabled", "n_components"} <= names
    assert set(ReduceConfig.model_fields) == {"pca_components", "umap", "fit_sample", "sample_by"}  # the stage's


def test_fits_blobs_and_predicts_them(blobs):
    x, y = blobs
    est = MapClusterer(**QUICK)
    labels = est.fit_predict(x)
    assert labels.dtype == np.int32 and est.n_clusters_ == 3 and est.n_features_in_ == 6
    assert adjusted_rand_score(y, labels) == pytest.approx(1.0)
    np.testing.assert_array_equal(est.predict(x), labels)
    assert est.transform(x).shape == (90, 2) and est.fit_transform(x).shape == (90, 2)
    assert est.backend_.name == "sklearn" and set(est.seconds_) >= {"reduce_fit", "cluster_fit"}


def test_grid_search_and_pipeline(blobs):
    x, y = blobs
    grid = GridSearchCV(MapClusterer(**QUICK), {"n_clusters": [2, 3, 5]}, scoring="adjusted_rand_score", cv=3)
    grid.fit(x, y)
    assert grid.best_params_ == {"n_clusters": 3}
    pipe = make_pipeline(StandardScaler(), MapClusterer(**{**QUICK, "method": "dbscan", "eps": 0.8}))
    assert adjusted_rand_score(y, pipe.fit_predict(x)) == pytest.approx(1.0)
    pipe.set_params(mapclusterer__eps=1e-4)  # every map its own noise
    assert (pipe.fit_predict(x) == -1).all()


# scikit-learn's own checks that apply: not those that set n_clusters to 1, which the job's rules refuse
CHECKS = [
    "check_no_attributes_set_in_init",
    "check_parameters_default_constructible",
    "check_get_params_invariance",
    "check_set_params",
    "check_estimators_overwrite_params",
    "check_estimators_fit_returns_self",
    "check_estimators_unfitted",
    "check_fit_idempotent",
    "check_clustering",
    "check_n_features_in",
    "check_estimators_nan_inf",
    "check_estimators_pickle",
    "check_transformer_general",
]


@pytest.mark.parametrize("check", CHECKS)
def test_scikit_learn_checks(check):
    getattr(checks, check)("MapClusterer", MapClusterer(**{**QUICK, "pca_components": 32}))


@pytest.mark.parametrize(
    "params, match",
    [
        ({"method": "spectral"}, r"^method: Input should be 'kmeans', 'dbscan' or 'hdbscan'"),
        ({"n_neighbors": 1}, r"^n_neighbors: Input should be greater than or equal to 2"),
        ({"umap_components": 1}, r"^umap_components: "),
        ({"pca_components": 1}, r"^pca_components: "),
        ({"n_clusters": "auto", "k_sweep": None}, r"^n_clusters: auto picks k from the k sweep"),
        ({"k_sweep": (5, 3)}, r"^k_sweep must be \[first, last\]"),
        ({"min_samples": True}, r"^min_samples: "),
        ({"random_state": -1}, r"^random_state: must be a whole number from 0 to 4294967295; got -1$"),
        ({"random_state": 2**32 - 2, "stability_seeds": 2}, r"^random_state: .* 0 to 4294967293 \(its 2 stability"),
        ({"random_state": None}, r"^random_state: "),
        ({"backend": "tpu"}, r"^backend: must be one of auto, cpu, gpu"),
    ],
)
def test_fit_refuses_bad_parameters_in_one_line(blobs, params, match):
    est = MapClusterer(**{**QUICK, **params})  # stored as given: refused by fit
    assert est.get_params()[next(iter(params))] == params[next(iter(params))]
    with pytest.raises(InvalidParameterError, match=match) as e:
        est.fit(blobs[0])
    assert "\n" not in str(e.value) and isinstance(e.value, (UserError, ValueError))


def test_gpu_backend_without_a_gpu_names_the_parameter(blobs, monkeypatch):
    from rapids_attn import devices

    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    with pytest.raises(BackendUnavailableError, match="^backend: gpu requested but no CUDA device is visible"):
        MapClusterer(**QUICK, backend="gpu").fit(blobs[0])
    assert MapClusterer(**QUICK, backend="auto").fit(blobs[0]).backend_.name == "sklearn"


def test_from_config_is_the_flat_form_fit_for_fit():
    reduce, cluster = learn_sections(
        **{"reduce.pca_components": 5, "cluster.n_clusters": "auto", "cluster.k_sweep": "[2, 5]"}
    )
    cfg = MapClusterer.from_config(reduce, cluster, 3, LearnBackend("sklearn", "t"))
    flat = MapClusterer(pca_components=5, n_clusters="auto", k_sweep=(2, 5), random_state=3)
    assert {**cfg.get_params(), "backend": "cpu"} == flat.get_params()
    x = np.random.default_rng(0).normal(size=(150, 8)).astype(np.float32)
    a, b = cfg.fit(x), flat.fit(x)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.embedding_, b.embedding_)
    assert a.k_sweep_ == b.k_sweep_ and a.seed_stability() == b.seed_stability()
    assert base.clone(cfg).get_params()["backend"] == LearnBackend("sklearn", "t")  # a resolved backend clones
    assert pickle.loads(pickle.dumps(a)).predict(x).tolist() == a.labels_.tolist()


def test_set_params_after_fit_changes_the_next_fit_only(blobs):
    x, _ = blobs
    est = MapClusterer(**{**QUICK, "stability_seeds": 2}).fit(x)
    first = est.seed_stability()
    est.set_params(stability_seeds=0, random_state=9)
    assert est.seed_stability() == first and first["seeds"] == [1, 2]
    assert est.fit(x).seed_stability() is None


def test_the_stage_prints_a_handful_of_progress_lines(tmp_path):
    """The learn stage's lines (learn.progress.stage_lines): one per step, the same on a terminal as in a log."""
    g, _ = planted_store(tmp_path)
    reduce, cluster = learn_sections(**{"cluster.k_sweep": "[2, 4]", "cluster.stability_seeds": 1})
    out = io.StringIO()
    logger = logging.getLogger("rapids_attn.learn")
    before = (logger.level, logger.propagate, list(logger.handlers))
    with stage_lines(out):
        fit_store(g, reduce, cluster, LearnBackend("sklearn", "t"), seed=0)
    assert (logger.level, logger.propagate, list(logger.handlers)) == before
    want = [
        r"reading all 360 maps to fit on \(scikit-learn\)",
        r"PCA to 4 components, fitted on 360 maps of 12 features",
        r"k sweep: KMeans for k 2 to 4 on 360 maps, each refitted with the next seed",
        r"KMeans with k 3",
        r"seed stability: KMeans refitted with the next 1 seed\(s\)",
        r"assigning and writing all 360 maps",
        r"3 cluster\(s\), silhouette 0\.\d{3}",
    ]
    lines = out.getvalue().splitlines()
    assert len(lines) == len(want), lines
    for line, pattern in zip(lines, want):
        assert re.fullmatch("rapids_attn: learn: " + pattern, line), line
    with stage_lines(out):
        logging.getLogger("rapids_attn.learn.fit").warning("a warning")
    assert out.getvalue().splitlines()[-1] == "warning: a warning"


def test_a_library_fit_prints_nothing(blobs, capsys):
    MapClusterer(**QUICK).fit(blobs[0])
    assert capsys.readouterr() == ("", "")

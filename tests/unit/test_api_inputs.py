"""The Python API's inputs from the hostile-user catalogue (issue 33, item 6): every bad argument of
analyse_maps and cluster_features is refused before any work with an ArgumentError (a ValueError; an
ArgumentTypeError, also a TypeError, for the wrong kind of value) whose one line starts with the argument's
name; valid inputs at the bounds still work."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rapids_attn.api import ArgumentError, ArgumentTypeError, analyse_maps, cluster_features
from rapids_attn.errors import UserError

B, H, T = 2, 3, 6
POOLED = {"embedder": "pooled", "image_size": 4, "pooled_size": 2}


def maps(b=B, h=H, t=T, seed=0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, t, t, generator=g).softmax(-1).to(dtype)


def with_value(value, at=(1, 2, 3, 4)) -> torch.Tensor:
    w = maps()
    w[at] = value
    return w


def per_layer(value, at) -> torch.Tensor:
    w = torch.stack([maps(seed=0), maps(seed=1)], dim=1)  # [batch, layer, head, T, T]
    w[at] = value
    return w


def not_summing() -> torch.Tensor:
    w = maps()
    w[1, 2, 4] *= 0.9  # row 4 of example 1, head 2 sums to 0.9
    return w


def padded(lengths=(T, 4)) -> torch.Tensor:
    """Row-stochastic over each example's first length tokens; the padding holds NaN, inf and negatives."""
    w = torch.full((B, H, T, T), float("nan"))
    for i, n in enumerate(lengths):
        w[i, :, :n, :n] = torch.randn(H, n, n).softmax(-1)
        if n < T:
            w[i, :, n:, 0] = float("inf")
            w[i, :, 0, n:] = -1.0
    return w


# (case id, analyse_maps keyword arguments over the defaults below, the exception, what the line starts with
# and, where it matters, a piece it must hold)
MAP_CASES = [
    ("maps-none", {"maps": None}, ArgumentTypeError, "maps:", "NoneType"),
    ("maps-text", {"maps": "attention"}, ArgumentTypeError, "maps:", "str"),
    ("maps-ragged", {"maps": [[[[1.0]]], [[[1.0, 0.0]]]]}, ArgumentTypeError, "maps:", "not one array"),
    ("maps-3d", {"maps": maps()[0]}, ArgumentError, "maps:", "(3, 6, 6)"),
    ("maps-6d", {"maps": maps()[None, None]}, ArgumentError, "maps:", "5-D"),
    ("maps-empty-batch", {"maps": torch.zeros(0, H, T, T)}, ArgumentError, "maps:", "batch dimension is empty"),
    ("maps-zero-heads", {"maps": torch.zeros(B, 0, T, T)}, ArgumentError, "maps:", "head dimension is empty"),
    ("maps-zero-layers", {"maps": torch.zeros(B, 0, H, T, T)}, ArgumentError, "maps:", "layer dimension is empty"),
    ("maps-t-zero", {"maps": torch.zeros(B, H, 0, 0)}, ArgumentError, "maps:", "T is 0"),
    ("maps-not-square", {"maps": maps()[..., :4]}, ArgumentError, "maps:", "6 x 4"),
    ("maps-int", {"maps": maps().round().long()}, ArgumentTypeError, "maps:", "int64"),
    ("maps-bool", {"maps": maps() > 0.5}, ArgumentTypeError, "maps:", "bool"),
    ("maps-int-numpy", {"maps": np.ones((B, H, T, T), dtype=np.int32)}, ArgumentTypeError, "maps:", "int32"),
    ("maps-complex", {"maps": maps().to(torch.complex64)}, ArgumentTypeError, "maps:", "complex"),
    ("maps-nan", {"maps": with_value(float("nan"))}, ArgumentError, "maps:", "row 3, key 4 of example 1, head 2"),
    ("maps-inf", {"maps": with_value(float("inf"))}, ArgumentError, "maps:", "inf (not finite)"),
    ("maps-minus-inf", {"maps": with_value(float("-inf"))}, ArgumentError, "maps:", "-inf (not finite)"),
    ("maps-negative", {"maps": with_value(-0.25)}, ArgumentError, "maps:", "-0.25 (negative)"),
    ("maps-nan-numpy", {"maps": with_value(float("nan")).numpy()}, ArgumentError, "maps:", "example 1, head 2"),
    ("maps-row-sum", {"maps": not_summing()}, ArgumentError, "maps:", "row 4 of example 1, head 2 sums to 0.9"),
    ("maps-scores", {"maps": torch.rand(B, H, T, T)}, ArgumentError, "maps:", "sums to"),
    ("maps-transposed", {"maps": maps().transpose(-1, -2)}, ArgumentError, "maps:", "sums to"),
    ("maps-float16-off", {"maps": (not_summing()).half()}, ArgumentError, "maps:", "tolerance 0.001 for float16"),
    (
        "maps-layer-named",
        {"maps": per_layer(float("nan"), (1, 1, 2, 3, 4))},
        ArgumentError,
        "maps:",
        "row 3, key 4 of example 1, layer 1, head 2",
    ),
    # padding is never read, but a row inside an example that sums to 1 only with its padding is refused
    ("maps-short-rows", {"maps": maps(), "lengths": [T, 4]}, ArgumentError, "maps:", "over its first 4 keys"),
    ("lengths-float", {"lengths": [T, 4.7]}, ArgumentTypeError, "lengths:", "entry 1 is float 4.7"),
    ("lengths-whole-float", {"lengths": [6.0, 4.0]}, ArgumentTypeError, "lengths:", "not rounded"),
    ("lengths-float-numpy", {"lengths": np.array([6.0, 4.7])}, ArgumentTypeError, "lengths:", "float64"),
    ("lengths-float-tensor", {"lengths": torch.tensor([6.0, 4.0])}, ArgumentTypeError, "lengths:", "float32"),
    ("lengths-bool-entry", {"lengths": [T, True]}, ArgumentTypeError, "lengths:", "entry 1 is bool"),
    ("lengths-bool-array", {"lengths": np.array([True, True])}, ArgumentTypeError, "lengths:", "bool"),
    ("lengths-text", {"lengths": "64"}, ArgumentTypeError, "lengths:", "str"),
    ("lengths-scalar", {"lengths": 6}, ArgumentTypeError, "lengths:", "int 6"),
    ("lengths-none-entry", {"lengths": [T, None]}, ArgumentTypeError, "lengths:", "NoneType"),
    ("lengths-2d", {"lengths": np.array([[6, 4]])}, ArgumentError, "lengths:", "(1, 2)"),
    ("lengths-count", {"lengths": [T]}, ArgumentError, "lengths:", "got 1 value"),
    ("lengths-zero", {"lengths": [T, 0]}, ArgumentError, "lengths:", "entry 1 is 0"),
    ("lengths-negative", {"lengths": np.array([T, -1])}, ArgumentError, "lengths:", "entry 1 is -1"),
    ("lengths-above-t", {"lengths": [T + 1, 4]}, ArgumentError, "lengths:", "entry 0 is 7"),
    ("sep-shape", {"sep": torch.zeros(B, T - 1, dtype=torch.bool)}, ArgumentError, "sep:", "[batch, T]"),
    ("sep-float", {"sep": torch.zeros(B, T)}, ArgumentTypeError, "sep:", "bool"),
    ("sep-int-not-01", {"sep": np.full((B, T), 2)}, ArgumentError, "sep:", "got 2 at (example 0, position 0)"),
    ("sep-text", {"sep": "[SEP]"}, ArgumentTypeError, "sep:", "str"),
    ("punct-shape", {"punct": np.zeros((B + 1, T), dtype=bool)}, ArgumentError, "punct:", "(3, 6)"),
    ("punct-float", {"punct": np.zeros((B, T))}, ArgumentTypeError, "punct:", "float64"),
    ("token-ids-float", {"token_ids": np.random.rand(B, T)}, ArgumentTypeError, "token_ids:", "float64"),
    ("token-ids-bool", {"token_ids": torch.ones(B, T, dtype=torch.bool)}, ArgumentTypeError, "token_ids:", "bool"),
    ("token-ids-shape", {"token_ids": torch.ones(B, T + 1, dtype=torch.long)}, ArgumentError, "token_ids:", "(2, 7)"),
    ("causal-int", {"causal": 1}, ArgumentTypeError, "causal:", "True or False"),
    ("causal-text", {"causal": "no"}, ArgumentTypeError, "causal:", "str"),
    ("image-size-zero", {"image_size": 0}, ArgumentError, "image_size:", "4..512"),
    # the job's bounds (extract.image_size), read from its schema: a size a job refuses is refused here too
    ("image-size-3", {"image_size": 3}, ArgumentError, "image_size:", "in 4..512; got 3"),
    ("image-size-negative", {"image_size": -4}, ArgumentError, "image_size:", "got -4"),
    ("image-size-huge", {"image_size": 100_000}, ArgumentError, "image_size:", "4..512"),
    ("image-size-513", {"image_size": 513}, ArgumentError, "image_size:", "got 513"),
    ("image-size-bool", {"image_size": True}, ArgumentTypeError, "image_size:", "bool"),
    ("image-size-float", {"image_size": 8.0}, ArgumentTypeError, "image_size:", "float"),
    ("image-size-text", {"image_size": "8"}, ArgumentTypeError, "image_size:", "str"),
    ("embedder-unknown", {"embedder": "nope"}, ArgumentError, "embedder:", "unknown embedder"),
    # every registered embedder is listed (from the registry: none can be left out)
    ("embedder-unknown-lists-all", {"embedder": "nope"}, ArgumentError, "embedder:", "use pattern-cnn, pooled, or a"),
    ("embedder-empty", {"embedder": ""}, ArgumentError, "embedder:", ""),
    ("embedder-not-text", {"embedder": 3}, ArgumentTypeError, "embedder:", "int"),
    ("embedder-long", {"embedder": "x" * 100_000}, ArgumentError, "embedder:", "..."),
    ("embed-setting-unknown", {"pooled_sz": 3}, ArgumentError, "pooled_sz:", "pooled_size"),
    ("embed-setting-small", {"pooled_size": 1}, ArgumentError, "pooled_size:", "got 1"),
    ("embed-setting-bool", {"pooled_size": True}, ArgumentError, "pooled_size:", "true/false"),
    ("embed-setting-above-image", {"pooled_size": 8}, ArgumentError, "pooled_size:", "image_size 4"),
    ("embed-setting-name", {"name": "pooled"}, ArgumentError, "name:", "embedder="),
    ("device-unknown", {"device": "gpu"}, ArgumentError, "device:", "'gpu'"),
    ("device-not-text", {"device": 0}, ArgumentTypeError, "device:", "int"),
    ("device-absent-cuda", {"device": "cuda:99"}, ArgumentError, "device:", "cuda:99"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "name", "piece"), [c[1:] for c in MAP_CASES], ids=[c[0] for c in MAP_CASES]
)
def test_analyse_maps_refuses_a_bad_argument_by_name(kwargs, error, name, piece):
    call = {"maps": maps(), **POOLED, **kwargs}
    with pytest.raises(error) as got:
        analyse_maps(call.pop("maps"), **call)
    line = str(got.value)
    assert line.startswith(name), line
    assert piece in line, line
    assert "\n" not in line, line


FEATURES = np.random.default_rng(0).normal(size=(40, 5))


def with_feature(value, dtype=np.float64) -> np.ndarray:
    x = FEATURES.astype(dtype)
    x[7, 3] = value
    return x


CLUSTER_CASES = [
    ("features-none", {"features": None}, ArgumentTypeError, "features:", "NoneType"),
    ("features-text", {"features": [["a", "b"], ["c", "d"]]}, ArgumentTypeError, "features:", "<U1"),
    ("features-ragged", {"features": [[1.0, 2.0], [3.0]]}, ArgumentTypeError, "features:", "not one array"),
    ("features-bool", {"features": FEATURES > 0}, ArgumentTypeError, "features:", "bool"),
    ("features-complex", {"features": FEATURES.astype(complex)}, ArgumentTypeError, "features:", "complex"),
    ("features-1d", {"features": FEATURES[:, 0]}, ArgumentError, "features:", "(40,)"),
    ("features-3d", {"features": FEATURES[None]}, ArgumentError, "features:", "reshape(-1, D)"),
    ("features-empty", {"features": np.zeros((0, 5))}, ArgumentError, "features:", "at least 2 rows"),
    ("features-one-row", {"features": FEATURES[:1]}, ArgumentError, "features:", "(1, 5)"),
    ("features-no-columns", {"features": np.zeros((40, 0))}, ArgumentError, "features:", "1 column"),
    ("features-nan", {"features": with_feature(np.nan)}, ArgumentError, "features:", "(row 7, column 3) is nan"),
    ("features-inf", {"features": with_feature(-np.inf)}, ArgumentError, "features:", "is -inf"),
    ("features-overflow", {"features": with_feature(1e300)}, ArgumentError, "features:", "overflows float32"),
    ("features-nan-tensor", {"features": torch.from_numpy(with_feature(np.nan))}, ArgumentError, "features:", "row 7"),
    ("method-unknown", {"method": "spectral"}, ArgumentError, "method:", "kmeans, dbscan, hdbscan"),
    ("method-not-text", {"method": 1}, ArgumentError, "method:", "got 1"),
    ("n-clusters-one", {"n_clusters": 1}, ArgumentError, "n_clusters:", ">= 2"),
    ("n-clusters-bool", {"n_clusters": True}, ArgumentTypeError, "n_clusters:", "bool"),
    ("n-clusters-float", {"n_clusters": 2.5}, ArgumentTypeError, "n_clusters:", "float 2.5"),
    ("n-clusters-word", {"n_clusters": "many"}, ArgumentError, "n_clusters:", "'auto'"),
    ("n-clusters-rows", {"n_clusters": 40}, ArgumentError, "n_clusters:", "at most 39"),
    ("n-clusters-auto-no-sweep", {"n_clusters": "auto"}, ArgumentError, "n_clusters:", "k_sweep"),
    ("pca-one", {"pca_components": 1}, ArgumentError, "pca_components:", ">= 2"),
    ("pca-bool", {"pca_components": True}, ArgumentTypeError, "pca_components:", "bool"),
    ("pca-float", {"pca_components": 4.0}, ArgumentTypeError, "pca_components:", "float"),
    ("pca-above-rows", {"features": FEATURES[:3], "n_clusters": 2}, ArgumentError, "pca_components:", "got 3"),
    ("umap-int", {"umap": 1}, ArgumentTypeError, "umap:", "True or False"),
    ("umap-few-rows", {"umap": True, "features": FEATURES[:12]}, ArgumentError, "umap:", "15 neighbours"),
    ("seed-negative", {"seed": -1}, ArgumentError, "seed:", "0..4294967295"),
    ("seed-huge", {"seed": 2**32}, ArgumentError, "seed:", "0..4294967295"),
    ("seed-refits", {"seed": 2**32 - 2}, ArgumentError, "seed:", "stability_seeds 2"),
    ("seed-float", {"seed": 1.5}, ArgumentTypeError, "seed:", "float"),
    ("seed-bool", {"seed": False}, ArgumentTypeError, "seed:", "bool"),
    ("backend-unknown", {"backend": "tpu"}, ArgumentError, "backend:", "auto, cpu, gpu"),
    ("setting-unknown", {"k_swep": [2, 5]}, ArgumentError, "k_swep:", "k_sweep"),
    ("k-sweep-order", {"n_clusters": "auto", "k_sweep": [5, 2]}, ArgumentError, "k_sweep", "2 <= first < last"),
    ("k-sweep-bool", {"k_sweep": [2, True]}, ArgumentError, "k_sweep", "true/false"),
    ("k-sweep-rows", {"n_clusters": "auto", "k_sweep": [40, 45]}, ArgumentError, "k_sweep:", "first k 40"),
    ("eps-zero", {"method": "dbscan", "eps": 0}, ArgumentError, "eps:", "greater than 0"),
    ("min-samples-rows", {"method": "dbscan", "min_samples": 41}, ArgumentError, "min_samples:", "at most 40"),
    ("min-cluster-size-rows", {"method": "hdbscan", "min_cluster_size": 21}, ArgumentError, "min_cluster_size:", "20"),
    ("stability-seeds-many", {"stability_seeds": 11}, ArgumentError, "stability_seeds:", "got 11"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "name", "piece"), [c[1:] for c in CLUSTER_CASES], ids=[c[0] for c in CLUSTER_CASES]
)
def test_cluster_features_refuses_a_bad_argument_by_name(kwargs, error, name, piece):
    call = {"features": FEATURES, "n_clusters": 3, "pca_components": 4, **kwargs}
    with pytest.raises(error) as got:
        cluster_features(call.pop("features"), **call)
    line = str(got.value)
    assert line.startswith(name), line
    assert piece in line, line
    assert "\n" not in line, line


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


@NO_CUDA
def test_a_gpu_that_is_not_there_is_named():
    with pytest.raises(ArgumentError, match=r"^device: 'cuda' requested but no CUDA device is visible; use"):
        analyse_maps(maps(), device="cuda", **POOLED)
    with pytest.raises(ArgumentError, match=r"^backend: gpu requested but no CUDA device is visible"):
        cluster_features(FEATURES, n_clusters=3, pca_components=4, backend="gpu")


def test_the_errors_are_value_errors_and_user_errors():
    """Callers that caught ValueError before still do; the wrong kind of value is also a TypeError."""
    assert issubclass(ArgumentError, ValueError) and issubclass(ArgumentError, UserError)
    assert issubclass(ArgumentTypeError, TypeError) and issubclass(ArgumentTypeError, ArgumentError)


def test_valid_maps_at_the_bounds():
    """One example, one head, T = 1; half precision within its tolerance; every kind of integer lengths; padding
    that holds NaN, inf and negatives; a reversed NumPy view; image_size 4, the job's smallest."""
    one = analyse_maps(torch.ones(1, 1, 1, 1), **POOLED)
    assert one.stats.shape[:2] == (1, 1) and one.stats[0, 0, one.stat_names.index("self")] == 1.0
    assert analyse_maps(torch.ones(1, 1, 1, 1), image_size=4).features.shape[:2] == (1, 1)  # the pattern CNN
    w = maps()
    reference = analyse_maps(w, **POOLED).stats
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        got = analyse_maps(w.to(dtype), **POOLED).stats
        np.testing.assert_allclose(got, reference, rtol=0.05, atol=0.02)
    wide = torch.randn(1, 2, 512, 512).softmax(-1).half()  # long float16 rows: rounding stays inside 1e-3
    assert analyse_maps(wide, **POOLED).stats.shape == (1, 2, len(one.stat_names))
    p = padded()
    want = analyse_maps(p, [T, 4], **POOLED).stats
    for lengths in (
        np.array([T, 4], dtype=np.int64),
        np.array([T, 4], dtype=np.uint8),
        torch.tensor([T, 4], dtype=torch.int32),
        [np.int64(T), np.int32(4)],
        list(torch.tensor([T, 4])),
        (T, 4),
    ):
        np.testing.assert_array_equal(analyse_maps(p, lengths, **POOLED).stats, want)
    flipped = np.ascontiguousarray(w.numpy()[::-1])[::-1]  # negative strides: torch needs a copy
    np.testing.assert_array_equal(analyse_maps(flipped, **POOLED).stats, reference)
    sep = np.zeros((B, T), dtype=np.int64)
    sep[:, 2] = 1
    as_ints = analyse_maps(w, sep=sep, token_ids=np.arange(B * T, dtype=np.uint8).reshape(B, T), **POOLED)
    as_bools = analyse_maps(w, sep=sep.astype(bool), token_ids=torch.arange(B * T).reshape(B, T), **POOLED)
    np.testing.assert_array_equal(as_ints.stats, as_bools.stats)
    assert analyse_maps(w, causal=np.bool_(False), image_size=np.int64(4), embedder="pooled", pooled_size=2)


def test_valid_features_at_the_bounds():
    """One column; integer features; a float16 tensor; k one below the rows; the silhouette None, not an error,
    where every map is a cluster of its own."""
    rng = np.random.default_rng(1)
    labels, info = cluster_features(rng.normal(size=(30, 1)), n_clusters=3)
    assert labels.shape == (30,) and info["reduced"].shape == (30, 1)
    ints, _ = cluster_features(rng.integers(0, 5, size=(30, 4)), n_clusters=2, pca_components=np.int64(2))
    assert ints.shape == (30,)
    half, _ = cluster_features(torch.from_numpy(FEATURES).half(), n_clusters=3, pca_components=4)
    assert half.shape == (40,)
    few, _ = cluster_features(FEATURES[:6], n_clusters=5, pca_components=2, stability_seeds=0)
    assert len(set(few.tolist())) == 5
    alone, info = cluster_features(FEATURES[:8], method="dbscan", eps=1e-6, min_samples=1, pca_components=2)
    assert len(set(alone.tolist())) == 8 and info["silhouette"] is None
    _, seeded = cluster_features(FEATURES, n_clusters=3, pca_components=4, seed=2**32 - 3)
    assert seeded["stability"]["seeds"] == [2**32 - 2, 2**32 - 1]


def test_image_size_takes_the_jobs_bounds():
    """analyse_maps takes exactly the image sizes a job's extract.image_size takes (the bounds read from the
    schema, so a change there moves both)."""
    from pydantic import ValidationError

    from rapids_attn.job import ExtractConfig

    for size in (3, 4, 512, 513):
        try:
            ExtractConfig(image_size=size)
            job_takes = True
        except ValidationError:
            job_takes = False
        if job_takes:
            assert analyse_maps(torch.ones(1, 1, 1, 1), image_size=size, embedder="pooled", pooled_size=2)
        else:
            with pytest.raises(ArgumentError, match=rf"^image_size: must be a whole number in 4\.\.512; got {size}$"):
                analyse_maps(torch.ones(1, 1, 1, 1), image_size=size, embedder="pooled", pooled_size=2)


def test_an_unknown_embedder_lists_every_registered_one(monkeypatch):
    """The list comes from the registry: an embedder registered later (a plugin) is listed too."""
    from rapids_attn.embed import registry

    monkeypatch.setitem(registry.EMBEDDERS, "my-embedder", registry.EmbedderSpec("nowhere:nothing"))
    with pytest.raises(ArgumentError) as got:
        analyse_maps(maps(), image_size=4, embedder="nope")
    line = str(got.value)
    assert line.startswith("embedder: unknown embedder 'nope'") and "\n" not in line, line
    for name in registry.EMBEDDERS:
        assert name in line, line

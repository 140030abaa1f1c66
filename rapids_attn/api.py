"""Maps you already have: the job's own per-map reductions, embedder and clustering, as two functions.

For attention maps that come from somewhere else (a TransformerLens cache, your own hooks, another
tool). :func:`analyse_maps` runs exactly the code an extraction worker runs on a captured layer
(:class:`rapids_attn.extract.maps.LayerReducer`, then the embedder), and :func:`cluster_features` the
learn stage's fit (``rapids_attn.learn.fit._Model``: PCA, optional UMAP, KMeans/DBSCAN/HDBSCAN, the
silhouette and KMeans's seed stability)::

    from rapids_attn.api import analyse_maps, cluster_features

    # maps: attention weights [batch, head, T, T] (or [batch, layer, head, T, T]), right-padded to T
    out = analyse_maps(maps, lengths, sep=sep_mask, punct=punct_mask, token_ids=tokens)
    out.stats[..., out.stat_names.index("prev")]        # [batch, (layer,) head]
    out.detectors[..., out.detector_names.index("induction_head")]
    out.pattern_names()                                  # the pattern CNN's label per map
    labels, info = cluster_features(out.features.reshape(-1, out.features.shape[-1]), n_clusters=8)

Token roles: ``sep`` and ``punct`` are [batch, T] bool masks (position 0 is the "first" token and is
never counted as a separator); without them those stats are 0. ``token_ids`` ([batch, T]) enable the
duplicate-token and induction detectors; without them those are NaN (the previous-token detector
needs no ids). Maps must be row-stochastic over each example's first ``length`` positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from rapids_attn.extract.maps import DETECTOR_NAMES, PROFILE_OFFSETS, STAT_NAMES, LayerReducer, TokenMasks


@dataclass
class MapAnalysis:
    """Per map (leading dimensions [batch, head] or [batch, layer, head]): what the job stores."""

    stats: np.ndarray  # [..., len(STAT_NAMES)] float32, at full resolution
    detectors: np.ndarray  # [..., len(DETECTOR_NAMES)] float32
    profile: np.ndarray  # [..., len(PROFILE_OFFSETS)] float32: mean attention at offsets -4..4
    images: np.ndarray  # [..., S, S] float32: the map area-resized, as the embedder sees it
    features: np.ndarray  # [..., dim] float32: the embedder's features (what the learn stage clusters)
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # pattern-cnn: pattern, pattern_prob
    classes: tuple[str, ...] = ()  # pattern-cnn: the names ``extras["pattern"]`` indexes
    stat_names: list[str] = field(default_factory=lambda: list(STAT_NAMES))
    detector_names: list[str] = field(default_factory=lambda: list(DETECTOR_NAMES))
    profile_offsets: list[int] = field(default_factory=lambda: list(PROFILE_OFFSETS))

    def pattern_names(self) -> np.ndarray:
        """The pattern type of every map, by name (pattern-cnn only)."""
        if "pattern" not in self.extras:
            raise ValueError("pattern names need embedder='pattern-cnn'")
        names = np.asarray([*self.classes, "?"], dtype=object)
        return names[np.clip(self.extras["pattern"].astype(np.int64), 0, len(self.classes))]


def _mask(value, shape, name: str) -> torch.Tensor:
    if value is None:
        return torch.zeros(shape, dtype=torch.bool)
    t = torch.as_tensor(np.asarray(value))
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)} ([batch, T]), got {tuple(t.shape)}")
    return t


def analyse_maps(
    maps,
    lengths=None,
    *,
    sep=None,
    punct=None,
    token_ids=None,
    causal: bool | None = None,
    image_size: int = 32,
    embedder: str = "pattern-cnn",
    device: str = "cpu",
    **embed_settings,
) -> MapAnalysis:
    """Signature, detectors, offset profile, image, features (and pattern labels) of every map.

    ``maps``: attention weights, [batch, head, T, T] or [batch, layer, head, T, T] (torch or NumPy), right-padded;
    ``lengths``: the real token count of each example (default T). ``causal``: decoder attention (the
    normalised entropy of row i divides by log(i + 1), as the job's maps of a decoder); by default, as the job's
    probe decides it: no map puts any weight above its diagonal. ``embedder``: ``pattern-cnn``,
    ``pooled`` or a torchvision model name, as ``embed.name`` in a job; ``embed_settings`` are the
    job's other ``embed`` fields (``pooled_size``, ``weights``, ``input_size`` ...)."""
    from rapids_attn.embed.base import build_embedder
    from rapids_attn.job import EmbedConfig

    w = maps if isinstance(maps, torch.Tensor) else torch.as_tensor(np.asarray(maps))
    per_layer = w.dim() == 5
    if not per_layer:
        if w.dim() != 4:
            raise ValueError(f"maps: expected [batch, head, T, T] or [batch, layer, head, T, T], got {tuple(w.shape)}")
        w = w[:, None]
    b, n_layers, n_heads, t, t2 = w.shape
    if t != t2:
        raise ValueError(f"maps: the last two dimensions must be equal (T x T), got {t} x {t2}")
    lengths = [t] * b if lengths is None else [int(n) for n in lengths]
    if len(lengths) != b or not all(1 <= n <= t for n in lengths):
        raise ValueError(f"lengths: expected {b} values in 1..{t}, got {lengths}")
    if causal is None:  # the job's rule (extract.shard's causality probe): nothing above any example's diagonal
        causal = max(lengths) > 1 and not any(
            bool(torch.triu(w[i, ..., :n, :n].float(), diagonal=1).any()) for i, n in enumerate(lengths)
        )
    sep_mask = _mask(sep, (b, t), "sep").clone()
    sep_mask[:, 0] = False  # position 0 is "first", never a separator too (as in the job)
    ids = token_ids
    masks = TokenMasks(
        sep=sep_mask,
        punct=_mask(punct, (b, t), "punct"),
        ids=torch.as_tensor(np.asarray(ids)) if ids is not None else torch.arange(t).repeat(b, 1),
    )
    reducer = LayerReducer(lengths, masks, list(range(n_layers)), list(range(n_heads)), image_size, 0, causal, device)
    for layer in range(n_layers):
        reducer(layer, w[:, layer].to(device))
    detectors = reducer.detectors
    if ids is None:  # no token ids: the repeat detectors are unknown, not 0
        repeat = [i for i, name in enumerate(DETECTOR_NAMES) if name not in ("previous_token_head", "streaming")]
        detectors[..., repeat] = float("nan")
    emb = build_embedder(EmbedConfig(name=embedder, **embed_settings), image_size, device)
    m = b * n_layers * n_heads
    feats, extras = emb.embed(
        reducer.images.reshape(m, image_size, image_size), reducer.profile.reshape(m, -1), reducer.stats.reshape(m, -1)
    )
    lead = (b, n_layers, n_heads) if per_layer else (b, n_heads)

    def shaped(x: torch.Tensor, tail: tuple[int, ...]) -> np.ndarray:
        return x.detach().cpu().numpy().reshape(*lead, *tail)

    return MapAnalysis(
        stats=shaped(reducer.stats, (len(STAT_NAMES),)),
        detectors=shaped(detectors, (len(DETECTOR_NAMES),)),
        profile=shaped(reducer.profile, (len(PROFILE_OFFSETS),)),
        images=shaped(reducer.images, (image_size, image_size)),
        features=shaped(feats.float(), (feats.shape[-1],)),
        extras={k: shaped(v, ()) for k, v in extras.items()},
        classes=tuple(getattr(emb, "classes", ())),
    )


def cluster_features(
    features,
    *,
    method: str = "kmeans",
    n_clusters: int | str = 8,
    pca_components: int = 32,
    umap: bool = False,
    seed: int = 0,
    backend: str = "cpu",
    **cluster_settings,
) -> tuple[np.ndarray, dict]:
    """Cluster [N, D] features with the learn stage's own fit: PCA to ``pca_components`` (then UMAP if
    ``umap``), then ``method`` (``kmeans``, ``dbscan``, ``hdbscan``). ``cluster_settings`` are any other
    ``cluster`` fields of a job (``k_sweep``, ``eps``, ``min_cluster_size``, ``stability_seeds`` ...).

    Returns (labels [N] int32, info): ``info`` has ``reduced`` ([N, components]), ``silhouette`` (on
    up to ``silhouette_sample`` points), ``stability`` (KMeans: ARI against refits with other seeds)
    and ``k_sweep`` (when swept)."""
    from rapids_attn.devices import resolve_learn_backend
    from rapids_attn.job import ClusterConfig, ReduceConfig
    from rapids_attn.learn.fit import _Model

    x = np.asarray(features, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"features: expected [N, D], got shape {x.shape}")
    settings = {"k_sweep": None, **cluster_settings}
    reduce = ReduceConfig(
        pca_components=min(pca_components, x.shape[1]), fit_sample=max(len(x), 1), umap={"enabled": umap}
    )
    cluster = ClusterConfig(method=method, n_clusters=n_clusters, **settings)
    learn = resolve_learn_backend(backend)
    model = _Model(reduce, cluster, seed, learn, x.shape[1])
    z, labels = model.fit(learn.asarray(x))
    info = {
        "reduced": learn.to_numpy(model.pca.transform(learn.asarray(x))),
        "silhouette": learn.silhouette(z, labels, cluster.silhouette_sample, seed),
        "stability": model.stability(),
        "k_sweep": model.sweep,
    }
    return learn.to_numpy(labels).astype(np.int32), info

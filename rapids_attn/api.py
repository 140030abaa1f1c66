"""Maps you already have: the job's own per-map reductions, embedder and clustering, as two functions.

For attention maps that come from somewhere else (a TransformerLens cache, your own hooks, another
tool). :func:`analyse_maps` runs exactly the code an extraction worker runs on a captured layer
(:class:`rapids_attn.extract.maps.LayerReducer`, then the embedder), and :func:`cluster_features` the
learn stage's fit (:class:`rapids_attn.learn.MapClusterer`: PCA, optional UMAP, KMeans/DBSCAN/HDBSCAN, the
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

Every argument is checked before any work: a bad one raises :class:`ArgumentError` (a ``ValueError``; a
:class:`ArgumentTypeError`, also a ``TypeError``, for the wrong kind of value) whose one line starts with the
argument's name and says what it must be, e.g. ``maps: row 3 of example 1, head 2 sums to 0.82 over its
first 9 keys; ...``. The checks of the maps are reductions over the whole tensor on its own device (a few
host synchronisations per block of about 16M weights), not a loop over rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from rapids_attn.errors import UserError
from rapids_attn.extract.maps import LayerReducer, TokenMasks
from rapids_attn.extract.signature import DETECTOR_NAMES, PROFILE_OFFSETS, STAT_NAMES


class ArgumentError(UserError, ValueError):
    """An argument of :func:`analyse_maps` or :func:`cluster_features` that cannot be used: the message starts
    with the argument's name and says what it must be."""


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong kind: a float where a whole number is needed, text or None for an array."""


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


#: the most characters of a user's value an error line quotes
_SHOW = 80
#: |row sum - 1| a row of attention probabilities may show, by dtype: rounding each weight to float16 moves the
#: sum by at most 2^-11 (about 5e-4), to bfloat16 by 2^-8 (4e-3); float32 sums of long rows stay far below 1e-3
_ROW_TOLERANCE = {torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float32: 1e-3, torch.float64: 1e-3}
#: weights of the maps checked at once (the checks' temporaries: a few bytes per weight)
_CHECK_BLOCK = 1 << 24
#: scikit-learn's and umap-learn's random_state: 0 .. 2^32 - 1
_MAX_SEED = 2**32 - 1
_METHODS = ("kmeans", "dbscan", "hdbscan")
_BACKENDS = ("auto", "cpu", "gpu")


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= _SHOW else text[: _SHOW - 3] + "..."


def _kind(value) -> str:
    """What a value is, in an error line: dtype and shape for arrays, type and (cut) repr otherwise."""
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).replace('torch.', '')} tensor of shape {tuple(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array of shape {value.shape}"
    return f"{type(value).__name__} {_show(value)}"


def _whole(value, name: str, low: int, high: int | None = None) -> int:
    """A whole number in low..high: an int or NumPy integer; a bool, float or string is refused, never converted."""
    span = f">= {low}" if high is None else f"in {low}..{high}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"{name}: must be a whole number {span}; got {_kind(value)}")
    if value < low or (high is not None and value > high):
        raise ArgumentError(f"{name}: must be a whole number {span}; got {int(value)}")
    return int(value)


def _job_bounds(section, field: str) -> tuple[int, int | None]:
    """(lowest, highest or None) of a job section's whole-number ``field``, read from its own ``Field(ge=..., le=...)``
    (gt/lt as the whole numbers inside them): an argument the job also takes has the job's bounds, never its own."""
    low, high = None, None
    for m in section.model_fields[field].metadata:
        if getattr(m, "ge", None) is not None:
            low = int(m.ge)
        if getattr(m, "gt", None) is not None:
            low = int(m.gt) + 1
        if getattr(m, "le", None) is not None:
            high = int(m.le)
        if getattr(m, "lt", None) is not None:
            high = int(m.lt) - 1
    if low is None:
        raise AssertionError(f"{section.__name__}.{field} has no lower bound")  # a schema change: fix _job_bounds
    return low, high


def _flag(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name}: must be True or False; got {_kind(value)}")
    return bool(value)


def _choice(value, name: str, options: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in options:
        raise ArgumentError(f"{name}: must be one of {', '.join(options)}; got {_show(value)}")
    return value


def _tensor(value, name: str, what: str) -> torch.Tensor:
    """``value`` (a torch tensor on any device, a NumPy or CUDA array, nested lists) as a tensor, not copied where
    it need not be; anything that is not one array of numbers or bools is refused, naming ``name``."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if hasattr(value, "__cuda_array_interface__"):  # CuPy, Numba: read where they are
        return torch.as_tensor(value)
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as e:  # ragged lists, objects NumPy cannot read
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ArgumentTypeError(f"{name}: must be {what}; {type(value).__name__} is not one array ({reason})") from None
    if arr.dtype.kind not in "biuf":
        raise ArgumentTypeError(f"{name}: must be {what}; got {_kind(value if arr.ndim else arr.item())}")
    try:
        return torch.as_tensor(arr)
    except ValueError:  # negative strides (a reversed view): torch needs a contiguous copy
        return torch.as_tensor(np.ascontiguousarray(arr))
    except TypeError:
        raise ArgumentTypeError(f"{name}: must be {what}; torch cannot hold dtype {arr.dtype}") from None


def _maps(maps) -> tuple[torch.Tensor, bool]:
    """maps -> ([batch, layer, head, T, T] floating weights, whether they came per layer): shape and dtype."""
    w = _tensor(maps, "maps", "attention probabilities [batch, head, T, T] or [batch, layer, head, T, T]")
    shape = tuple(w.shape)
    if w.dim() not in (4, 5):
        raise ArgumentError(
            "maps: must be a 4-D array [batch, head, T, T] or a 5-D array [batch, layer, head, T, T] of attention "
            f"probabilities; got shape {shape}"
        )
    if not w.is_floating_point():
        raise ArgumentTypeError(
            f"maps: must hold floating-point attention probabilities; got {_kind(w)}: convert them with "
            "maps.float() (NumPy: maps.astype(np.float32)) if they are weights"
        )
    per_layer = w.dim() == 5
    dims = ("batch", "layer", "head") if per_layer else ("batch", "head")
    for size, dim in zip(shape, dims):
        if size == 0:
            one = "example" if dim == "batch" else dim
            raise ArgumentError(f"maps: the {dim} dimension is empty (shape {shape}); pass at least one {one}")
    if shape[-1] != shape[-2]:
        raise ArgumentError(f"maps: the last two dimensions must be equal (T x T); got {shape[-2]} x {shape[-1]}")
    if shape[-1] == 0:
        raise ArgumentError(f"maps: T is 0 (shape {shape}); a map needs at least one token")
    return (w if per_layer else w[:, None]), per_layer


def _lengths(lengths, b: int, t: int) -> list[int]:
    """Each example's token count: whole numbers in 1..T, one per example (never rounded)."""
    if lengths is None:
        return [t] * b
    want = f"{b} whole number{'s' if b > 1 else ''} in 1..{t} (each example's token count; T is the maps' last size)"
    if isinstance(lengths, (torch.Tensor, np.ndarray)):
        integer = (
            lengths.dtype.kind in "iu"
            if isinstance(lengths, np.ndarray)
            else (not lengths.is_floating_point() and not lengths.is_complex() and lengths.dtype != torch.bool)
        )
        if not integer and not (isinstance(lengths, np.ndarray) and lengths.dtype == object):
            raise ArgumentTypeError(
                f"lengths: must be {want}; got {_kind(lengths)}: token counts are whole numbers, not rounded"
            )
        if lengths.ndim != 1:
            raise ArgumentError(f"lengths: must be {want}, a 1-D sequence; got shape {tuple(lengths.shape)}")
        values = lengths.tolist()  # one transfer for a CUDA tensor
    elif isinstance(lengths, (str, bytes, dict)) or not hasattr(lengths, "__iter__"):
        raise ArgumentTypeError(f"lengths: must be {want}; got {_kind(lengths)}")
    else:
        values = list(lengths)
    out = []
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor) and v.dim() == 0 and not v.is_floating_point() and v.dtype != torch.bool:
            v = v.item()
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise ArgumentTypeError(
                f"lengths: must be {want}; entry {i} is {_kind(v)}: token counts are whole numbers, not rounded"
            )
        out.append(int(v))
    if len(out) != b:
        raise ArgumentError(f"lengths: must be {want}; got {len(out)} value{'s' if len(out) != 1 else ''}")
    for i, n in enumerate(out):
        if not 1 <= n <= t:
            raise ArgumentError(f"lengths: must be {want}; entry {i} is {n}")
    return out


def _mask(value, b: int, t: int, name: str) -> torch.Tensor:
    """A [batch, T] bool mask (None: all False). Integer masks of 0 and 1 are read as bools; floats are refused."""
    if value is None:
        return torch.zeros(b, t, dtype=torch.bool)
    m = _tensor(value, name, "a [batch, T] bool mask")
    if tuple(m.shape) != (b, t):
        raise ArgumentError(f"{name}: expected shape {(b, t)} ([batch, T]), got {tuple(m.shape)}")
    if m.dtype == torch.bool:
        return m
    if m.is_floating_point() or m.is_complex():
        raise ArgumentTypeError(
            f"{name}: must be a [batch, T] bool mask; got {_kind(m)}: convert it with {name}.bool() if it holds 0 and 1"
        )
    other = (m != 0) & (m != 1)
    if bool(other.any()):
        i, j = (int(k) for k in other.nonzero()[0])
        raise ArgumentError(
            f"{name}: an integer mask must hold only 0 and 1; got {int(m[i, j])} at (example {i}, position {j})"
        )
    return m != 0


def _token_ids(value, b: int, t: int) -> torch.Tensor | None:
    if value is None:
        return None
    ids = _tensor(value, "token_ids", "[batch, T] integer token ids")
    if tuple(ids.shape) != (b, t):
        raise ArgumentError(f"token_ids: expected shape {(b, t)} ([batch, T]), got {tuple(ids.shape)}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ArgumentTypeError(f"token_ids: must be [batch, T] integer token ids; got {_kind(ids)}")
    return ids.long()


def _device(device) -> str:
    """``cpu``, ``cuda`` or ``cuda:N`` (a str or torch.device) that this machine has."""
    if not isinstance(device, (str, torch.device)):
        raise ArgumentTypeError(f"device: must be 'cpu', 'cuda' or 'cuda:N'; got {_kind(device)}")
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError):
        raise ArgumentError(f"device: must be 'cpu', 'cuda' or 'cuda:N'; got {_show(device)}") from None
    if d.type not in ("cpu", "cuda"):
        raise ArgumentError(f"device: must be 'cpu', 'cuda' or 'cuda:N'; got {_show(device)}")
    if d.type == "cuda":
        from rapids_attn.devices import missing_cuda_device

        why = missing_cuda_device(d.index)
        if why is not None:
            fix = "; use device='cpu'" if why.startswith("no ") else ""
            raise ArgumentError(f"device: {_show(device)} requested but {why}{fix}")
    return str(d)


def _blocks(b: int, n_layers: int, n_heads: int, per_map: int):
    """(examples, layers, heads) slices that cover every map, each of about _CHECK_BLOCK weights or one map:
    whole examples while they fit, else the layers of one example, else its heads of one layer."""
    every = slice(None)
    if n_layers * n_heads * per_map <= _CHECK_BLOCK:
        step = max(1, _CHECK_BLOCK // (n_layers * n_heads * per_map))
        for e in range(0, b, step):
            yield slice(e, min(e + step, b)), every, every
    elif n_heads * per_map <= _CHECK_BLOCK:
        step = max(1, _CHECK_BLOCK // (n_heads * per_map))
        for e in range(b):
            for layer in range(0, n_layers, step):
                yield slice(e, e + 1), slice(layer, min(layer + step, n_layers)), every
    else:
        step = max(1, _CHECK_BLOCK // per_map)
        for e in range(b):
            for layer in range(n_layers):
                for h in range(0, n_heads, step):
                    yield slice(e, e + 1), slice(layer, layer + 1), slice(h, min(h + step, n_heads))


def _check_values(w: torch.Tensor, lengths: list[int], per_layer: bool, probe_causal: bool) -> bool:
    """Every weight an example's first ``length`` rows give its first ``length`` keys (what the reducer reads;
    padding may hold anything) is finite and >= 0, and each such row sums to 1 over those keys. Vectorised over
    blocks of maps (:func:`_blocks`) with one host synchronisation per block (one in all for most inputs).
    Returns, with ``probe_causal``, whether any of those weights lies above the diagonal (the job's probe)."""
    b, n_layers, n_heads, t, _ = w.shape
    tol = _ROW_TOLERANCE.get(w.dtype, 1e-3)
    acc = torch.float64 if w.dtype == torch.float64 else torch.float32
    pos = torch.arange(t, device=w.device)
    n_all = torch.tensor(lengths, device=w.device)
    upper = False

    def where(e: slice, layer: slice, h: slice, idx) -> str:
        e0, l0, h0 = (s.start or 0 for s in (e, layer, h))
        lay = f", layer {l0 + int(idx[1])}" if per_layer else ""
        return f"example {e0 + int(idx[0])}{lay}, head {h0 + int(idx[2])}"

    for e, layer, h in _blocks(b, n_layers, n_heads, t * t):
        c = w[e, layer, h]  # [examples, layers, heads, T, T]: a view
        seen = pos[None, :] < n_all[e][:, None]  # [examples, T]: the rows and keys inside each example
        inside = seen[:, None, None, :, None] & seen[:, None, None, None, :]
        inner = torch.where(inside, c, 0) if min(lengths[e]) < t else c  # padding (it may hold anything) as 0
        sums = inner.sum(-1, dtype=acc)  # [examples, layers, heads, T]: an inf weight makes its row's sum inf
        off = ((sums - 1).abs() > tol) & seen[:, None, None, :]
        flags = [~(inner >= 0).all(), off.any()]  # NaN and -inf fail ">= 0" too
        if probe_causal:
            flags.append((inner.triu(1) != 0).any())
        flags = torch.stack(flags).tolist()  # the block's one synchronisation
        if flags[0] or flags[1]:
            bad = (~torch.isfinite(c) | (c < 0)) & inside
            flags[0] = bool(bad.any())
        if flags[0]:
            idx = bad.nonzero()[0]
            value = c[tuple(idx)].item()
            i, j = int(idx[3]), int(idx[4])
            what = "not finite" if not np.isfinite(value) else "negative"
            raise ArgumentError(
                f"maps: the weight at row {i}, key {j} of {where(e, layer, h, idx)} is {value!r} ({what}); "
                "attention maps are probabilities (softmax outputs): finite and >= 0 over each example's first "
                "`lengths` tokens"
            )
        if flags[1]:
            idx = off.nonzero()[0]
            ex = (e.start or 0) + int(idx[0])
            row, total = int(idx[3]), sums[tuple(idx)].item()
            raise ArgumentError(
                f"maps: row {row} of {where(e, layer, h, idx)} sums to {total:.6g} over its first {lengths[ex]} keys, "
                f"not 1 (tolerance {tol:g} for {str(w.dtype).replace('torch.', '')}): pass attention probabilities "
                "(softmax over the keys, not scores or a transposed map), and lengths for right-padded maps"
            )
        upper = upper or (probe_causal and flags[2])
    return upper


def _settings_error(err, where: str, fields, renamed: dict[str, str] | None = None) -> ArgumentError:
    """A job section's pydantic ValidationError for keyword arguments -> one ArgumentError naming the first one."""
    first = err.errors()[0]
    loc = [renamed.get(str(p), str(p)) if renamed else str(p) for p in first.get("loc", ())]
    name = loc[0] + "".join(f"[{p}]" for p in loc[1:]) if loc else ""
    if first.get("type") == "extra_forbidden":
        known = ", ".join(f for f in fields if f not in (renamed or {}))
        return ArgumentError(f"{name}: not a setting of {where}; its settings are {known}")
    msg = first.get("msg", str(err)).removeprefix("Value error, ")
    if not name:  # a validator of the whole section: its message names the field
        return ArgumentError(msg)
    return ArgumentError(f"{name}: {msg}; got {_show(first.get('input'))}")


def _renamed(err: Exception, names: dict[str, str], kind: type[ArgumentError] = ArgumentError) -> ArgumentError:
    """A job error about a setting (``embed.pooled_size: ...``) in the API's words (``pooled_size: ...``)."""
    text = str(err)
    for old, new in names.items():
        text = text.replace(old, new)
    return kind(text)


_EMBED_NAMES = {"embed.name": "embedder", "extract.image_size": "image_size", "embed.": ""}


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
    job's other ``embed`` fields (``pooled_size``, ``weights``, ``input_size`` ...).

    Checked first, each refused with an :class:`ArgumentError` naming it: ``maps`` floating-point (ints and bools
    refused: convert deliberately), no empty dimension, T x T; inside each example's first ``length`` rows and keys
    every weight finite and >= 0 and every row summing to 1 within 1e-3 (float16, float32, float64) or 1e-2
    (bfloat16); the padding is never read. ``lengths``: one whole number in 1..T per example (ints, NumPy or torch
    integers; 4.7 is refused, not rounded). ``sep``, ``punct``: [batch, T] bools (or integers 0 and 1);
    ``token_ids``: [batch, T] integers. ``causal``: None, True or False. ``image_size``: a whole number in
    4..512 (``extract.image_size``'s bounds, read from the job's schema). ``device``: ``cpu``, or a CUDA device this
    machine has. ``embedder`` and ``embed_settings``: the job's ``embed`` rules."""
    from pydantic import ValidationError

    from rapids_attn.embed import build_embedder
    from rapids_attn.embed.registry import embedder_names
    from rapids_attn.errors import JobConfigError
    from rapids_attn.job import EmbedConfig, ExtractConfig

    if causal is not None:
        causal = _flag(causal, "causal")
    image_size = _whole(image_size, "image_size", *_job_bounds(ExtractConfig, "image_size"))
    if not isinstance(embedder, str) or not embedder or len(embedder) > _SHOW:
        kind = ArgumentError if isinstance(embedder, str) else ArgumentTypeError
        raise kind(f"embedder: must be a name: {embedder_names()}; got {_kind(embedder)}")
    if "name" in embed_settings:
        raise ArgumentError("name: analyse_maps takes the embedder's name as embedder=..., not name=...")
    try:
        embed_cfg = EmbedConfig(name=embedder, **embed_settings)
    except ValidationError as e:
        raise _settings_error(e, "analyse_maps's embedder", EmbedConfig.model_fields, {"name": "embedder"}) from None
    device = _device(device)
    w, per_layer = _maps(maps)
    b, n_layers, n_heads, t, _ = w.shape
    lengths = _lengths(lengths, b, t)
    sep_mask = _mask(sep, b, t, "sep").clone()
    sep_mask[:, 0] = False  # position 0 is "first", never a separator too (as in the job)
    punct_mask = _mask(punct, b, t, "punct")
    ids = _token_ids(token_ids, b, t)
    # the job's causality rule (extract.shard's probe): nothing above any example's diagonal, found in the same pass
    upper = _check_values(w, lengths, per_layer, probe_causal=causal is None)
    if causal is None:
        causal = max(lengths) > 1 and not upper
    try:
        emb = build_embedder(embed_cfg, image_size, device)
    except JobConfigError as e:
        raise _renamed(e, _EMBED_NAMES) from None
    masks = TokenMasks(sep=sep_mask, punct=punct_mask, ids=ids if ids is not None else torch.arange(t).repeat(b, 1))
    reducer = LayerReducer(lengths, masks, list(range(n_layers)), list(range(n_heads)), image_size, 0, causal, device)
    for layer in range(n_layers):
        reducer(layer, w[:, layer].to(device))
    detectors = reducer.detectors
    if ids is None:  # no token ids: the repeat detectors are unknown, not 0
        repeat = [i for i, name in enumerate(DETECTOR_NAMES) if name not in ("previous_token_head", "streaming")]
        detectors[..., repeat] = float("nan")
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
    up to ``silhouette_sample`` points; None where undefined), ``stability`` (KMeans: ARI against refits with
    other seeds) and ``k_sweep`` (when swept).

    Checked first, each refused with an :class:`ArgumentError` naming it: ``features`` real numbers (bools
    refused), 2-D with at least 2 rows, finite in float32; ``method`` and ``backend`` among their names;
    ``n_clusters`` a whole number >= 2 below the rows (KMeans), or ``auto`` with a ``k_sweep`` whose first k is
    below the rows; ``pca_components`` a whole number >= 2, clipped to D, at most the rows; ``umap`` True or
    False (UMAP's 15 neighbours need more rows); ``seed`` a whole number in 0..2^32 - 1 (the stability refits'
    seeds included); ``cluster_settings`` the job's ``cluster`` rules, with DBSCAN's and HDBSCAN's
    ``min_samples`` at most the rows and HDBSCAN's ``min_cluster_size`` at most half of them."""
    from pydantic import ValidationError

    from rapids_attn.devices import resolve_learn_backend
    from rapids_attn.errors import BackendUnavailableError
    from rapids_attn.job import ClusterConfig, ReduceConfig
    from rapids_attn.learn.estimator import MapClusterer

    method = _choice(method, "method", _METHODS)
    if not (isinstance(n_clusters, str) and n_clusters == "auto"):
        if isinstance(n_clusters, str):
            raise ArgumentError(f"n_clusters: must be a whole number >= 2 or 'auto'; got {_show(n_clusters)}")
        n_clusters = _whole(n_clusters, "n_clusters", 2)
    pca_components = _whole(pca_components, "pca_components", *_job_bounds(ReduceConfig, "pca_components"))
    umap = _flag(umap, "umap")
    seed = _whole(seed, "seed", 0, _MAX_SEED)
    backend = _choice(backend, "backend", _BACKENDS)
    for name in ("method", "n_clusters"):
        if name in cluster_settings:  # cannot happen through a call (a keyword given twice); a dict spread
            raise ArgumentError(f"{name}: given twice")
    try:
        cluster = ClusterConfig(method=method, n_clusters=n_clusters, **{"k_sweep": None, **cluster_settings})
    except ValidationError as e:
        raise _settings_error(e, "cluster_features", ClusterConfig.model_fields) from None
    x = _features(features)
    n, d = x.shape
    components = min(pca_components, d)  # PCA keeps at most D components: pca_components is clipped to them
    _check_fit_sizes(cluster, n, components, umap, seed)
    try:
        learn = resolve_learn_backend(backend)
    except BackendUnavailableError as e:
        raise _renamed(e, {"runtime.learn_backend": "backend", "learn_backend": "backend"}) from None
    # ReduceConfig asks for 2 components or more; MapClusterer clips them to D (one, for one-column features)
    reduce = ReduceConfig(pca_components=max(components, 2), fit_sample=max(n, 2), umap={"enabled": umap})
    model = MapClusterer.from_config(reduce, cluster, seed, learn)
    try:
        model.fit(learn.asarray(x))
        z, labels = model.embedding_, model.labels_
    except BackendUnavailableError as e:  # umap-learn missing
        raise _renamed(e, {"reduce.umap.enabled": "umap"}) from None
    info = {
        "reduced": learn.to_numpy(model.pca_.transform(learn.asarray(x))),
        "silhouette": _silhouette(learn, z, labels, cluster.silhouette_sample, seed),
        "stability": model.seed_stability(),
        "k_sweep": model.k_sweep_,
    }
    return learn.to_numpy(labels).astype(np.int32), info


def _features(features) -> np.ndarray:
    """[N, D] real numbers (N >= 2, D >= 1) -> float32, every value finite once in float32."""
    what = "an [N, D] array of real numbers (one row per map)"
    if isinstance(features, torch.Tensor) or hasattr(features, "__cuda_array_interface__"):
        t = _tensor(features, "features", what)
        if t.dtype == torch.bool or t.is_complex():
            raise ArgumentTypeError(f"features: must be {what}; got {_kind(t)}")
        arr = (t.float() if t.dtype in (torch.float16, torch.bfloat16) else t).cpu().numpy()
    else:
        try:
            arr = np.asarray(features)
        except (ValueError, TypeError) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ArgumentTypeError(
                f"features: must be {what}; {type(features).__name__} is not one array ({reason})"
            ) from None
    if arr.dtype.kind not in "iuf":
        raise ArgumentTypeError(f"features: must be {what}; got {_kind(arr if arr.ndim else arr.item())}")
    if arr.ndim != 2:
        raise ArgumentError(f"features: must be {what}; got shape {arr.shape}: reshape(-1, D) for [..., D] features")
    if arr.shape[0] < 2 or arr.shape[1] < 1:
        raise ArgumentError(f"features: must be {what} with at least 2 rows and 1 column; got shape {arr.shape}")
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.asarray(arr, dtype=np.float32)
    bad = ~np.isfinite(x)
    if bad.any():
        i, j = np.unravel_index(int(np.argmax(bad)), bad.shape)
        value = arr[i, j].item()
        why = f"{value!r} overflows float32" if np.isfinite(value) else f"{value!r}"
        raise ArgumentError(
            f"features: the value at (row {i}, column {j}) is {why}; clustering needs finite numbers in float32's range"
        )
    return x


def _check_fit_sizes(cluster, n: int, components: int, umap: bool, seed: int) -> None:
    """What the learn stage's preflight checks of a run (LearnStage.check), for N rows of features given here."""
    rows = f"the {n} rows of features"
    if components > n:
        raise ArgumentError(
            f"pca_components: {components} components need at least {components} rows of features; got {n}: "
            f"pass pca_components={n} or fewer, or more rows"
        )
    if umap:
        from rapids_attn.job import UmapConfig

        u = UmapConfig()
        if u.n_neighbors >= n or u.n_components + 2 > n:
            raise ArgumentError(
                f"umap: UMAP's {u.n_neighbors} neighbours need more than {u.n_neighbors} rows of features; got {n}: "
                "pass umap=False or more rows"
            )
    c = cluster
    if c.method in ("dbscan", "hdbscan") and c.min_samples > n:
        raise ArgumentError(
            f"min_samples: {c.min_samples} is more than {rows} (every map would be noise); use at most {n}"
        )
    if c.method == "hdbscan" and 2 * c.min_cluster_size > n:
        raise ArgumentError(
            f"min_cluster_size: two clusters of {c.min_cluster_size} maps do not fit in {rows} (every map would be "
            f"noise); use at most {n // 2}"
        )
    if c.method == "kmeans":
        if isinstance(c.n_clusters, int) and c.n_clusters >= n:
            raise ArgumentError(f"n_clusters: {c.n_clusters} clusters need more than {rows}; use at most {n - 1}")
        sweep_n = min(n, c.sweep_sample)
        if c.k_sweep is not None and c.k_sweep[0] >= sweep_n:
            raise ArgumentError(
                f"k_sweep: its first k {c.k_sweep[0]} is not below the {sweep_n} rows the sweep fits on (the rows of "
                "features, at most sweep_sample); lower it"
            )
        if seed + c.stability_seeds > _MAX_SEED:  # the stability refits use the next seeds
            raise ArgumentError(
                f"seed: {seed} + stability_seeds {c.stability_seeds} passes {_MAX_SEED}, the largest seed "
                f"scikit-learn takes; use at most {_MAX_SEED - c.stability_seeds}"
            )


def _silhouette(learn, z, labels, sample: int, seed: int) -> float | None:
    """The learn backend's silhouette, None where it is undefined (the backend's own rule), also where every
    sampled map is a cluster of its own (DBSCAN or HDBSCAN with tiny clusters, or a sample of n_clusters maps or
    fewer), which scikit-learn refuses."""
    try:
        return learn.silhouette(z, labels, sample, seed)
    except ValueError as e:
        if "Number of labels" in str(e):
            return None
        raise

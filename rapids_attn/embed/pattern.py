"""The attention-pattern CNN as a map embedder (``embed.name: pattern-cnn``; docs/pattern-cnn.md).

Unlike the image-only embedders, it reads all three things the pipeline keeps for a map: the
area-resized image, the full-resolution offset profile and the scalar signature. It returns the
network's penultimate layer (the features that are reduced and clustered) and, as extra per-map
outputs, the pattern label and the calibrated probability of the CNN's top type (store arrays
``pattern`` and ``pattern_prob``; the class names and the weights' hash are store attributes).
A map keeps the CNN's type only if its statistics satisfy that type's defining rule and the
calibrated probability is at least ``rules.MIN_PROB``; otherwise it is ``other``
(rapids_attn/patterns/rules.py)::

    emb = PatternCNNEmbedder("cpu")
    features, extras = emb.embed(images, profile, stats)   # [N, dim]; extras["pattern"] [N]
    emb.classes[int(extras["pattern"][0])]                  # e.g. "prev"

**Features** (what the learn stage reduces and clusters; ``dim`` = 128 + 18 = 146): the network's
embedding, then the map's own full-resolution description times ``SIDE_SCALE`` (16): the offset
profile (9), the length-free stats ``SIDE_STATS`` (8 masses and shares in [0, 1]; ``entropy`` in nats
and ``distance`` in tokens are left out, they measure the length as much as the pattern) and
``rules.shared_columns`` (1). The network alone maps an unfamiliar map onto the nearest type it knows;
the side copy keeps what the map's statistics say in the feature space (docs/pattern-cnn.md,
"Features for clustering"). The scale (16) was chosen on seed 0 of the three evaluation generators
(tools/pattern_cnn/evaluate_independent.py) among 0, 2, 4, 8, 16 and 32 for the shipped network, and
held on seeds 1 and 2. A one-token map's undefined (NaN) stats enter as 0.

Images of another size than the network's (32) are area-resized with the pipeline's ``area_resize``.
Runs batched under ``torch.inference_mode``; outputs are on the device of ``images``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from rapids_attn.embed.base import Embedder, Embedding
from rapids_attn.errors import JobConfigError
from rapids_attn.extract.maps import area_resize
from rapids_attn.extract.signature import PROFILE_OFFSETS, STAT_NAMES
from rapids_attn.store.schema import PATTERN, PATTERN_PROB, Attr

#: The stats copied into the features (length-free: shares of a row's mass, or normalised entropy).
SIDE_STATS = ("entropy_norm", "first", "sep", "punct", "self", "prev", "next", "max")
#: The factor on the side copy [profile, SIDE_STATS, shared_columns] in the features.
SIDE_SCALE = 16.0
_SIDE_IDX = [STAT_NAMES.index(n) for n in SIDE_STATS]
_FIRST = STAT_NAMES.index("first")


class PatternCNNEmbedder(Embedder):
    def __init__(
        self, device="cpu", batch_size: int = 4096, precision: str = "float32", weights_dir: Path | str | None = None
    ):
        """``precision``: ``float32`` or ``float16`` (the device plan gives float16 on a GPU)."""
        from rapids_attn.patterns.cnn import WEIGHTS_DIR, WEIGHTS_FILE, load_pattern_cnn
        from rapids_attn.patterns.rules import LABELS, MIN_PROB, RULES_VERSION

        super().__init__()
        self.name = "pattern-cnn"
        self.device = torch.device(device)
        self.dtype = torch.float16 if precision == "float16" else torch.float32
        try:
            model, meta = load_pattern_cnn(self.device, weights_dir)
        except FileNotFoundError as e:
            raise JobConfigError(f"embed.name: pattern-cnn weights are missing ({e}); reinstall rapids_attn") from None
        self.model = model.to(self.dtype)
        self.meta = meta
        self.batch_size = int(batch_size)
        #: the CNN's types, then ``other`` (the labels the ``pattern`` array indexes)
        self.classes = tuple(LABELS)
        if tuple(meta["classes"]) != LABELS[:-1]:
            raise JobConfigError(
                f"embed.name: pattern-cnn weights name classes {meta['classes']}, expected {LABELS[:-1]}"
            )
        #: softmax temperature fitted on held-out generated maps (tools/pattern_cnn/calibrate.py)
        self.temperature = float(meta.get("temperature", 1.0))
        self.image_size = int(meta["image_size"])
        #: the network's embedding, then the side copy (profile, SIDE_STATS, shared_columns)
        self.dim = int(model.embed_dim) + len(PROFILE_OFFSETS) + len(SIDE_STATS) + 1
        self.outputs = {PATTERN: "int8", PATTERN_PROB: "float16"}
        weights = (Path(weights_dir) if weights_dir is not None else WEIGHTS_DIR) / WEIGHTS_FILE.name
        # the weights' hash is part of the store's layout: new weights make a different store
        self.store_attrs = {
            Attr.PATTERN_CLASSES: list(self.classes),
            Attr.PATTERN_CNN_SHA: hashlib.sha256(weights.read_bytes()).hexdigest()[:16],
            # how the labels were made: a change makes a different store
            "pattern_labelling": {"temperature": self.temperature, "min_prob": MIN_PROB, "rules": RULES_VERSION},
            # what the features are: the embedding, then the scaled side copy
            "pattern_features": {
                "embedding": int(model.embed_dim),
                "side_stats": list(SIDE_STATS),
                "scale": SIDE_SCALE,
            },
        }

    @torch.inference_mode()
    def embed(self, images: torch.Tensor, profile: torch.Tensor, stats: torch.Tensor) -> Embedding:
        """images [N, S, S], profile [N, 9], stats [N, 10] -> features [N, dim] float32 (the network's
        embedding, then ``SIDE_SCALE`` x [profile, SIDE_STATS, shared_columns]), and extras
        ``pattern`` [N] int64 (index into ``classes``; ``other`` where the CNN's type contradicts the
        stats or is not probable enough) and ``pattern_prob`` [N] float32 (the calibrated probability of
        the CNN's top type)."""
        from rapids_attn.patterns.rules import label, shared_columns

        n = images.shape[0]
        if profile.shape != (n, len(PROFILE_OFFSETS)) or stats.shape != (n, len(STAT_NAMES)):
            raise ValueError(
                f"expected profile [{n}, {len(PROFILE_OFFSETS)}] and stats [{n}, {len(STAT_NAMES)}], "
                f"got {tuple(profile.shape)} and {tuple(stats.shape)}"
            )
        out_device = images.device
        feats, patterns, probs = [], [], []
        for a in range(0, n, self.batch_size):
            x = images[a : a + self.batch_size].to(self.device, torch.float32)
            if x.shape[-1] != self.image_size or x.shape[-2] != self.image_size:
                x = area_resize(x, self.image_size)
            p = profile[a : a + self.batch_size].to(self.device, self.dtype)
            # a one-token map's undefined stats (NaN) enter the network as 0, the value it was trained around
            s = torch.nan_to_num(stats[a : a + self.batch_size], nan=0.0).to(self.device, self.dtype)
            logits, f = self.model(x.to(self.dtype), p, s, return_features=True)
            # the rules read the stats as given, in float32: an undefined (NaN) stat satisfies no rule
            raw_s = stats[a : a + self.batch_size].to(self.device, torch.float32)
            raw_p = profile[a : a + self.batch_size].to(self.device, torch.float32)
            idx, top = label(logits, raw_s, raw_p, self.temperature, images=x)
            cols = shared_columns(x, raw_s[:, _FIRST])[:, None]
            side = torch.cat([raw_p, raw_s[:, _SIDE_IDX], cols], 1).nan_to_num(nan=0.0) * SIDE_SCALE
            feats.append(torch.cat([f.float(), side], 1))
            patterns.append(idx)
            probs.append(top)
        if not feats:
            return Embedding(
                torch.zeros(0, self.dim, device=out_device),
                {
                    PATTERN: torch.zeros(0, dtype=torch.long, device=out_device),
                    PATTERN_PROB: torch.zeros(0, device=out_device),
                },
            )
        return Embedding(
            torch.cat(feats).to(out_device),
            {
                PATTERN: torch.cat(patterns).to(out_device, torch.long),
                PATTERN_PROB: torch.cat(probs).to(out_device, torch.float32),
            },
        )


def from_config(cfg, image_size: int, *, device: str, precision: str, prepare: bool) -> PatternCNNEmbedder:
    """The :class:`~rapids_attn.embed.base.EmbedderFactory` of ``pattern-cnn``: the shipped weights, at the
    device plan's device and precision (float32 or float16), ``embed.batch_size`` maps per network call."""
    return PatternCNNEmbedder(device, cfg.batch_size, precision)

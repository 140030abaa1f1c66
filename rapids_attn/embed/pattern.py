"""The attention-pattern CNN as a map embedder (docs/pattern-cnn.md).

Unlike the image-only embedders, it reads all three things the pipeline keeps for a map: the
area-resized image, the full-resolution offset profile and the scalar signature. It returns the
network's penultimate layer (the features that are reduced and clustered), the predicted pattern
type and that type's probability.

    emb = PatternEmbedder("cpu")
    features, pattern, prob = emb(images, profile, stats)   # [N, dim], [N], [N]
    emb.classes[pattern[0]]                                  # e.g. "prev"

Images of another size than the network's (32) are area-resized with the pipeline's ``area_resize``.
Runs batched under ``torch.inference_mode``, in half precision on CUDA. Outputs are on the device
of ``images``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rapids_attn.embed.base import Embedder
from rapids_attn.extract.maps import PROFILE_OFFSETS, STAT_NAMES, area_resize


class PatternEmbedder(Embedder):
    name = "pattern-cnn"

    def __init__(self, device="cpu", batch_size: int = 4096, weights_dir: Path | str | None = None,
                 dtype: torch.dtype | None = None):
        """``dtype``: None for float16 on CUDA and float32 on the CPU."""
        from rapids_attn.patterns.cnn import load_pattern_cnn

        self.device = torch.device(device)
        self.dtype = dtype or (torch.float16 if self.device.type == "cuda" else torch.float32)
        model, meta = load_pattern_cnn(self.device, weights_dir)
        self.model = model.to(self.dtype)
        self.meta = meta
        self.batch_size = int(batch_size)
        self.classes = tuple(meta["classes"])
        self.image_size = int(meta["image_size"])
        self.dim = int(model.embed_dim)

    @torch.inference_mode()
    def __call__(self, images: torch.Tensor, profile: torch.Tensor, stats: torch.Tensor):
        """images [N, S, S], profile [N, 9], stats [N, 10] -> (features [N, dim] float32,
        pattern [N] int64 (index into ``classes``), prob [N] float32 (its softmax probability))."""
        n = images.shape[0]
        if profile.shape != (n, len(PROFILE_OFFSETS)) or stats.shape != (n, len(STAT_NAMES)):
            raise ValueError(f"expected profile [{n}, {len(PROFILE_OFFSETS)}] and stats [{n}, {len(STAT_NAMES)}], "
                             f"got {tuple(profile.shape)} and {tuple(stats.shape)}")
        out_device = images.device
        feats, patterns, probs = [], [], []
        for a in range(0, n, self.batch_size):
            x = images[a:a + self.batch_size].to(self.device, torch.float32)
            if x.shape[-1] != self.image_size or x.shape[-2] != self.image_size:
                x = area_resize(x, self.image_size)
            p = profile[a:a + self.batch_size].to(self.device, self.dtype)
            s = stats[a:a + self.batch_size].to(self.device, self.dtype)
            logits, f = self.model(x.to(self.dtype), p, s, return_features=True)
            prob = torch.softmax(logits.float(), dim=1)
            top, idx = prob.max(dim=1)
            feats.append(f.float())
            patterns.append(idx)
            probs.append(top)
        if not feats:
            return (torch.zeros(0, self.dim, device=out_device), torch.zeros(0, dtype=torch.long, device=out_device),
                    torch.zeros(0, device=out_device))
        return (torch.cat(feats).to(out_device), torch.cat(patterns).to(out_device, torch.long),
                torch.cat(probs).to(out_device, torch.float32))

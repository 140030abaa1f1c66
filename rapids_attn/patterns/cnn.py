"""PatternCNN: classifies an attention map from its image, offset profile and scalar signature.

Inputs are exactly what the pipeline stores for every map (rapids_attn/extract/maps.py):

- ``images`` [N, S, S]: the area-resized map (S = 32); each image is divided by its own maximum
  (faint broad maps and sharp ones use the same range; the maximum itself is in the stats);
- ``profile`` [N, 9]: mean attention at offsets -4..4 from the diagonal, at full resolution;
- ``stats`` [N, 10]: the scalar signature (STAT_NAMES), at full resolution.

A conv trunk reads the image (32 -> 16 -> 8 -> 4, three stride-2 convs, flattened so that *where* a stripe is survives:
a stripe on the first column and one on the last are different patterns), a small MLP reads the
standardised [profile, stats] (fixed constants from the training set, stored with the weights), and
both feed one hidden layer, the **embedding** (``embed_dim`` wide), then the classifier.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from rapids_attn.extract.signature import PROFILE_OFFSETS, STAT_NAMES

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
WEIGHTS_FILE = WEIGHTS_DIR / "pattern_cnn.safetensors"
META_FILE = WEIGHTS_DIR / "pattern_cnn.json"

N_SIDE = len(PROFILE_OFFSETS) + len(STAT_NAMES)


def _conv(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
    )


class PatternCNN(nn.Module):
    def __init__(self, n_classes: int, image_size: int = 32, embed_dim: int = 128, width: int = 24):
        super().__init__()
        if image_size % 8:
            raise ValueError(f"image_size must be a multiple of 8, got {image_size}")
        self.image_size = image_size
        self.embed_dim = embed_dim
        w = width
        # three stride-2 3x3 convs (their windows overlap, so no pixel is skipped): 32 -> 16 -> 8 -> 4.
        # A stride-1 stem at 32 x 32 made a training step several times slower on a 2-core CPU.
        self.trunk = nn.Sequential(_conv(1, w, 2), _conv(w, 2 * w, 2), _conv(2 * w, 64, 2))
        flat = 64 * (image_size // 8) ** 2
        self.image_fc = nn.Sequential(nn.Flatten(), nn.Linear(flat, 128), nn.ReLU(inplace=True))
        self.side = nn.Sequential(
            nn.Linear(N_SIDE, 64), nn.ReLU(inplace=True), nn.Linear(64, 64), nn.ReLU(inplace=True)
        )
        self.embed = nn.Sequential(nn.Linear(128 + 64, embed_dim), nn.ReLU(inplace=True))
        self.classifier = nn.Linear(embed_dim, n_classes)
        # standardisation of [profile, stats], fixed from the training set (saved with the weights)
        self.register_buffer("side_mean", torch.zeros(N_SIDE))
        self.register_buffer("side_std", torch.ones(N_SIDE))

    def set_normalisation(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.side_mean.copy_(mean)
        self.side_std.copy_(std.clamp_min(1e-6))

    def features(self, images: torch.Tensor, profile: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
        """[N, S, S], [N, 9], [N, 10] -> the embedding [N, embed_dim]."""
        x = images.unsqueeze(1)
        x = x / x.amax(dim=(-2, -1), keepdim=True).clamp_min(1e-6)  # 1e-6: representable in float16
        side = (torch.cat([profile, stats], dim=1) - self.side_mean) / self.side_std
        return self.embed(torch.cat([self.image_fc(self.trunk(x)), self.side(side)], dim=1))

    def forward(self, images, profile, stats, return_features: bool = False):
        f = self.features(images, profile, stats)
        logits = self.classifier(f)
        return (logits, f) if return_features else logits


def save_pattern_cnn(model: PatternCNN, meta: dict, out_dir: Path) -> tuple[Path, Path]:
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    wpath, mpath = out_dir / WEIGHTS_FILE.name, out_dir / META_FILE.name
    save_file(state, str(wpath), metadata={"format": "pt"})  # one key: byte-identical files for identical weights
    wpath.chmod(0o644)  # safetensors writes 0600; this file ships as package data
    mpath.write_text(json.dumps(meta, indent=1) + "\n")
    return wpath, mpath


def load_pattern_cnn(device="cpu", weights_dir: Path | str | None = None) -> tuple[PatternCNN, dict]:
    """The shipped network (eval mode, on ``device``) and its metadata (classes, image_size,
    normalisation constants, training seed and command, held-out accuracy, training time)."""
    from safetensors.torch import load_file

    d = Path(weights_dir) if weights_dir is not None else WEIGHTS_DIR
    wpath, mpath = d / WEIGHTS_FILE.name, d / META_FILE.name
    if not wpath.is_file() or not mpath.is_file():
        raise FileNotFoundError(
            f"pattern CNN weights not found in {d}; train them with python -m tools.pattern_cnn.train from a checkout"
        )
    meta = json.loads(mpath.read_text())
    arch = meta["architecture"]
    model = PatternCNN(len(meta["classes"]), meta["image_size"], arch["embed_dim"], arch["width"])
    model.load_state_dict(load_file(str(wpath)))
    return model.eval().to(device), meta

"""The embedder registry (rapids_attn.embed.registry): one table from embed.name to a factory, an interface
module that imports no implementation, and a new embedder added by one registration."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rapids_attn.embed import build_embedder, registry
from rapids_attn.embed.base import Embedder, Embedding, ImageEmbedder
from rapids_attn.job import EmbedConfig


def test_each_registered_name_builds_its_embedder():
    for name in registry.EMBEDDERS:
        emb = build_embedder(EmbedConfig(name=name, pooled_size=4), image_size=32, prepare=False)
        assert isinstance(emb, Embedder) and emb.name == name and emb.dim > 0


def test_other_names_are_torchvision_backbones():
    assert registry.embedder_spec("resnet18") is registry.BACKBONES
    assert all(registry.embedder_spec(name) is spec for name, spec in registry.EMBEDDERS.items())


def test_interface_and_registry_import_no_implementation_and_no_torch():
    code = (
        "import sys, rapids_attn.embed, rapids_attn.embed.base, rapids_attn.embed.registry; "
        "print(sorted(m for m in sys.modules if m.startswith(('torch', 'rapids_attn.embed.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert eval(out) == ["rapids_attn.embed.base", "rapids_attn.embed.registry"]


def test_int8_rule_of_the_job_schema_agrees_with_the_registry():
    """job.py's EmbedConfig refuses precision int8 for the embedders whose spec says it does not apply."""
    for name, spec in [*registry.EMBEDDERS.items(), ("resnet18", registry.BACKBONES)]:
        if spec.int8:
            assert EmbedConfig(name=name, precision="int8").precision == "int8"
        else:
            with pytest.raises(ValueError, match="precision int8 applies to torchvision backbones"):
                EmbedConfig(name=name, precision="int8")


class _Toy(ImageEmbedder):
    def __init__(self, dim: int):
        super().__init__()
        self.name, self.dim = "toy", dim

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return images.flatten(1)[:, : self.dim].float()


def _toy(cfg, image_size, *, device, precision, prepare):
    return _Toy(min(cfg.pooled_size, image_size * image_size))


def test_a_new_embedder_is_one_registration(monkeypatch):
    monkeypatch.setattr(registry, "EMBEDDERS", dict(registry.EMBEDDERS))
    registry.register("toy", _toy)
    emb = build_embedder(EmbedConfig(name="toy", pooled_size=3), image_size=4)
    features, extras = emb.embed(torch.ones(2, 4, 4), torch.zeros(2, 9), torch.zeros(2, 10))
    assert isinstance(emb, _Toy) and features.shape == (2, 3) and extras == {}
    assert isinstance(emb.embed(torch.ones(1, 4, 4), None, None), Embedding)
    with pytest.raises(ValueError, match="registered already"):
        registry.register("toy", _toy)
    with pytest.raises(ValueError, match="registered already"):
        registry.register("pooled", "somewhere:else")


def test_a_factory_by_path_is_imported_when_built(monkeypatch):
    monkeypatch.setattr(registry, "EMBEDDERS", dict(registry.EMBEDDERS))
    registry.register("toy", f"{__name__}:_toy")
    assert isinstance(build_embedder(EmbedConfig(name="toy", pooled_size=2), image_size=4), _Toy)

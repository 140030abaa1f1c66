"""Tests for rapids_attn.embed: the pooled baseline, torchvision backbones with random, file and
ImageNet weights, and the error messages for bad names and unreachable weights."""

from __future__ import annotations

import math
import urllib.error

import numpy as np
import pytest
import torch

from rapids_attn.embed import build_embedder
from rapids_attn.embed.backbone import BackboneEmbedder, ensure_imagenet_weights, imagenet_cache_path
from rapids_attn.embed.pooled import PooledEmbedder
from rapids_attn.errors import JobConfigError
from rapids_attn.job import EmbedConfig

MEAN = torch.tensor((0.485, 0.456, 0.406)).view(1, 3, 1, 1)
STD = torch.tensor((0.229, 0.224, 0.225)).view(1, 3, 1, 1)


def maps(n: int, size: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(n, size, size, generator=g)
    return a / a.sum(-1, keepdim=True)


def adaptive_pool_loops(img: np.ndarray, p: int) -> np.ndarray:
    """Adaptive average pooling written out: cell i covers [floor(i*S/p), ceil((i+1)*S/p))."""
    s = img.shape[0]
    out = np.zeros((p, p))
    for i in range(p):
        r0, r1 = (i * s) // p, math.ceil((i + 1) * s / p)
        for j in range(p):
            c0, c1 = (j * s) // p, math.ceil((j + 1) * s / p)
            out[i, j] = img[r0:r1, c0:c1].mean()
    return out


# --- pooled -----------------------------------------------------------------------------------


@pytest.mark.parametrize("image_size,pooled", [(16, 4), (16, 16), (12, 8), (32, 5)])
def test_pooled_embedder(image_size, pooled):
    emb = PooledEmbedder(image_size, pooled)
    assert emb.name == "pooled" and emb.dim == pooled * pooled
    x = maps(5, image_size)
    out = emb(x)
    assert out.shape == (5, emb.dim) and out.dtype == torch.float32
    for k in range(5):
        expected = adaptive_pool_loops(x[k].double().numpy(), pooled).reshape(-1)
        np.testing.assert_allclose(out[k].numpy(), expected, rtol=1e-5, atol=1e-7)


def test_pooled_blocks_when_divisible():
    x = maps(3, 16)
    out = PooledEmbedder(16, 4)(x)
    assert torch.allclose(out, x.reshape(3, 4, 4, 4, 4).mean(dim=(2, 4)).reshape(3, 16), atol=1e-7)


def test_pooled_size_larger_than_image_rejected():
    with pytest.raises(JobConfigError, match="embed.pooled_size: 32 is larger than extract.image_size 16"):
        PooledEmbedder(16, 32)
    with pytest.raises(JobConfigError, match="embed.pooled_size"):
        build_embedder(EmbedConfig(name="pooled", pooled_size=20), image_size=16)


# --- backbones --------------------------------------------------------------------------------


def resnet18_source(seed: int = 123) -> torch.nn.Module:
    import torchvision

    torch.manual_seed(seed)
    return torchvision.models.resnet18(weights=None).eval()


def penultimate(net: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Features before the classifier, for images already at the input size with max 1."""
    x = (images.unsqueeze(1).expand(-1, 3, -1, -1) - MEAN) / STD
    body = torch.nn.Sequential(*list(net.children())[:-1])  # everything but fc
    with torch.no_grad():
        return body(x).flatten(1)


def test_random_weights_are_seeded_and_finite():
    a = BackboneEmbedder("resnet18", "random", input_size=32, batch_size=4)
    b = BackboneEmbedder("resnet18", "random", input_size=32, batch_size=4)
    assert a.dim == b.dim == 512 and a.name == "resnet18"
    for (ka, va), (kb, vb) in zip(a.net.state_dict().items(), b.net.state_dict().items()):
        assert ka == kb and torch.equal(va, vb), ka
    x = maps(10, 16)
    out = a(x)  # 10 images in batches of 4
    assert out.shape == (10, 512) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert torch.allclose(out, b(x))
    assert not torch.allclose(out[0], out[1])  # different maps, different features
    # each map is scaled by its maximum first, so a fainter copy embeds the same
    assert torch.allclose(a(x * 0.25), out, atol=1e-4)
    assert a(torch.zeros(0, 16, 16)).shape == (0, 512)


def test_weights_from_a_file(tmp_path):
    src = resnet18_source()
    path = tmp_path / "r18.pth"
    torch.save(src.state_dict(), path)
    emb = BackboneEmbedder("resnet18", str(path), input_size=32, batch_size=8)
    assert emb.dim == 512
    x = maps(4, 32, seed=1)
    x = x / x.amax(dim=(-2, -1), keepdim=True)  # already at max 1 and at the input size
    assert torch.allclose(emb(x), penultimate(src, x), atol=1e-4)
    # and it is not the seeded random control
    rnd = BackboneEmbedder("resnet18", "random", input_size=32, batch_size=8)
    assert not torch.allclose(rnd(x), emb(x), atol=1e-3)


def test_weights_file_wrapped_in_state_dict_key(tmp_path):
    src = resnet18_source(seed=7)
    path = tmp_path / "ckpt.pt"
    torch.save({"state_dict": src.state_dict(), "epoch": 3}, path)
    emb = BackboneEmbedder("resnet18", str(path), input_size=32, batch_size=8)
    x = torch.eye(32).unsqueeze(0)
    assert torch.allclose(emb(x), penultimate(src, x), atol=1e-4)


def test_bad_weights_file(tmp_path):
    bad = tmp_path / "junk.pth"
    bad.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(JobConfigError, match=r"embed\.weights: .*junk\.pth is not a resnet18 state dict"):
        BackboneEmbedder("resnet18", str(bad), input_size=32, batch_size=8)


def test_weights_file_of_another_network(tmp_path):
    import torchvision

    other = tmp_path / "r34.pth"
    torch.save(torchvision.models.resnet34(weights=None).state_dict(), other)
    with pytest.raises(JobConfigError, match=r"embed\.weights: .*r34\.pth is not a resnet18 state dict"):
        BackboneEmbedder("resnet18", str(other), input_size=32, batch_size=8)


def test_missing_weights_file(tmp_path):
    with pytest.raises(JobConfigError, match=r"embed\.weights: no such file: .*nothing\.pth"):
        BackboneEmbedder("resnet18", str(tmp_path / "nothing.pth"), input_size=32, batch_size=8)


def test_unknown_backbone_suggests_the_near_name():
    with pytest.raises(JobConfigError, match=r"embed\.name: unknown embedder 'resnet81'; did you mean 'resnet18'\?"):
        BackboneEmbedder("resnet81", "random", input_size=32, batch_size=8)


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "convnext_tiny"])
def test_other_backbones_give_flat_features(name):
    # ConvNeXt's classifier holds the flatten; MobileNet's has no batch norm after its last conv
    emb = BackboneEmbedder(name, "random", input_size=32, batch_size=4)
    out = emb(maps(3, 16))
    assert out.shape == (3, emb.dim) and torch.isfinite(out).all()


def test_batch_norms_are_folded_exactly():
    import torchvision

    emb = BackboneEmbedder("resnet18", "random", input_size=32, batch_size=4)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in emb.net.modules())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # the same seeded network, unfolded
        plain = torchvision.models.resnet18(weights=None).eval()
    plain.fc = torch.nn.Identity()
    x = maps(4, 16)
    with torch.no_grad():
        expected = plain(emb._prepare(x).contiguous())
    torch.testing.assert_close(emb(x), expected, rtol=1e-4, atol=1e-4)


def test_build_embedder_dispatch():
    emb = build_embedder(EmbedConfig(name="resnet18", weights="random", input_size=16), image_size=8)
    assert isinstance(emb, BackboneEmbedder) and emb.dim == 512 and emb.input_size == 16
    assert isinstance(build_embedder(EmbedConfig(name="pooled", pooled_size=4), image_size=8), PooledEmbedder)


# --- int8 backbones (CPU) ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def resnet18_fp32_int8():
    fp32 = BackboneEmbedder("resnet18", "random", input_size=32, batch_size=8)
    int8 = BackboneEmbedder("resnet18", "random", input_size=32, batch_size=8, precision="int8", image_size=16)
    return fp32, int8


def test_int8_backbone_tracks_float32_on_attention_maps(resnet18_fp32_int8):
    from rapids_attn.patterns.generator import generate_features

    fp32, int8 = resnet18_fp32_int8
    # held-out synthetic maps (another seed than the calibration's), as the pipeline gives them
    x = generate_features(99, 24, image_size=16)[0]
    a, b = fp32(x), int8(x)
    assert b.shape == a.shape == (24, 512) and b.dtype == torch.float32
    assert any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in int8.net.modules())  # really int8
    assert not torch.equal(a, b)
    cos = torch.nn.functional.cosine_similarity(a, b)
    assert cos.min() > 0.99, cos
    # the geometry the clustering sees is kept: pairwise distances correlate almost perfectly
    iu = torch.triu_indices(24, 24, 1)
    da, db = torch.cdist(a, a)[iu[0], iu[1]], torch.cdist(b, b)[iu[0], iu[1]]
    assert torch.corrcoef(torch.stack([da, db]))[0, 1] > 0.98


def test_int8_calibration_is_the_same_in_every_worker(resnet18_fp32_int8):
    # two workers quantize independently: their features must be identical, or shards would disagree
    _, int8 = resnet18_fp32_int8
    other = BackboneEmbedder("resnet18", "random", input_size=32, batch_size=8, precision="int8", image_size=16)
    x = maps(10, 16, seed=3)
    assert torch.equal(int8(x), other(x))


def test_int8_is_for_backbones_only(tmp_path):
    # (int8 on a GPU is refused by the device plan: tests/unit/test_devices.py)
    with pytest.raises(ValueError, match="precision int8 applies to torchvision backbones"):
        EmbedConfig(name="pattern-cnn", precision="int8")
    with pytest.raises(ValueError, match="precision int8 applies to torchvision backbones"):
        EmbedConfig(name="pooled", precision="int8")


def test_preflight_skips_the_int8_calibration():
    emb = build_embedder(
        EmbedConfig(name="resnet18", weights="random", precision="int8"), image_size=8, precision="int8", prepare=False
    )
    assert not any(type(m).__module__.startswith("torch.ao.nn") for m in emb.net.modules())


# --- ImageNet weights: cache, offline failure -------------------------------------------------


@pytest.fixture
def empty_hub(tmp_path, monkeypatch):
    """torch hub pointed at an empty folder, and every download failing as it would offline."""
    from torchvision.models._api import WeightsEnum

    hub = tmp_path / "hub"
    hub.mkdir()
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(hub))
    calls = []

    def no_network(self, *args, **kwargs):
        calls.append(self.url)
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(WeightsEnum, "get_state_dict", no_network)
    return hub, calls


def test_imagenet_offline_names_the_field_and_the_file_option(empty_hub):
    hub, calls = empty_hub
    with pytest.raises(JobConfigError) as err:
        BackboneEmbedder("resnet18", "imagenet", input_size=32, batch_size=8)
    msg = str(err.value)
    assert msg.startswith("embed.weights: ImageNet weights for resnet18")
    assert "URLError" in msg
    assert "resnet18-f37072fd.pth" in msg and "https://download.pytorch.org/" in msg
    assert "embed.weights: /path/to/resnet18-f37072fd.pth" in msg  # how to pass a file instead
    assert "embed.weights: random" in msg
    assert str(hub / "checkpoints") in msg
    assert len(calls) == 1  # it did try to download


def test_imagenet_weights_found_in_the_cache_are_used_without_download(empty_hub):
    hub, calls = empty_hub
    path = imagenet_cache_path("resnet18")
    assert path.parent == hub / "checkpoints"
    path.parent.mkdir()
    src = resnet18_source(seed=5)
    torch.save(src.state_dict(), path)
    assert ensure_imagenet_weights("resnet18") == path
    emb = BackboneEmbedder("resnet18", "imagenet", input_size=32, batch_size=8)
    x = torch.eye(32).flip(0).unsqueeze(0)
    assert torch.allclose(emb(x), penultimate(src, x), atol=1e-4)
    assert calls == []

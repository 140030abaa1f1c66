"""Every embedder ``embed.name`` can name, registered in one table, and :func:`build_embedder`.

An entry maps a name to an :class:`EmbedderSpec`: where its factory is (``"module:function"``, an
:class:`~rapids_attn.embed.base.EmbedderFactory`, imported only when the embedder is built, so naming
one costs no import) and what the job schema may check before anything is built (``int8``: whether
``embed.precision: int8`` applies). A name the table does not list is a torchvision classification
model (:data:`BACKBONES`), which the backbone factory checks against torchvision's own list.

Adding an embedder is one module with the class and its factory, and one line in :data:`EMBEDDERS`
(docs/architecture.md, "Adding an embedder"); :func:`register` adds one at run time (a plugin, a test).
This module imports no torch and no implementation.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rapids_attn.embed.base import Embedder, EmbedderFactory


@dataclass(frozen=True)
class EmbedderSpec:
    #: ``"package.module:function"`` (imported when the embedder is first built) or the factory itself
    factory: str | EmbedderFactory
    #: whether ``embed.precision: int8`` applies (the job schema refuses it for the others)
    int8: bool = False

    def load(self) -> EmbedderFactory:
        if not isinstance(self.factory, str):
            return self.factory
        module, _, name = self.factory.partition(":")
        return getattr(importlib.import_module(module), name)


#: name -> spec: the embedders that have a name of their own
EMBEDDERS: dict[str, EmbedderSpec] = {
    "pattern-cnn": EmbedderSpec("rapids_attn.embed.pattern:from_config"),
    "pooled": EmbedderSpec("rapids_attn.embed.pooled:from_config"),
}

#: every other name: a torchvision classification model (``resnet18``, ``resnet50``, ...), its penultimate layer
BACKBONES = EmbedderSpec("rapids_attn.embed.backbone:from_config", int8=True)


def embedder_spec(name: str) -> EmbedderSpec:
    """The spec that builds ``embed.name: name``: its entry in :data:`EMBEDDERS`, else :data:`BACKBONES`."""
    return EMBEDDERS.get(name, BACKBONES)


def embedder_names() -> str:
    """The names ``embed.name`` takes, as an error line lists them: every embedder of :data:`EMBEDDERS` (so none is
    ever left out), then the torchvision backbones."""
    return f"{', '.join(EMBEDDERS)}, or a torchvision classification model (resnet18, resnet50, ...)"


def register(name: str, factory: str | EmbedderFactory, *, int8: bool = False) -> None:
    """Adds ``name`` to :data:`EMBEDDERS`; a name already there is refused (a ValueError), never replaced."""
    if name in EMBEDDERS:
        raise ValueError(f"an embedder named {name!r} is registered already ({EMBEDDERS[name].factory})")
    EMBEDDERS[name] = EmbedderSpec(factory, int8=int8)


def build_embedder(
    cfg, image_size: int, device: str = "cpu", precision: str = "float32", prepare: bool = True
) -> Embedder:
    """``cfg`` is the job's EmbedConfig; ``device`` and ``precision`` (``float32``, ``float16`` or
    ``int8``) come from the device plan. Raises JobConfigError for an unknown name or bad weights.
    ``prepare=False`` (preflight) loads and checks without the one-off int8 calibration."""
    factory = embedder_spec(cfg.name).load()
    return factory(cfg, image_size, device=device, precision=precision, prepare=prepare)

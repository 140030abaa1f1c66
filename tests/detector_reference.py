"""The plain reference definitions of the head detectors, used only by the tests: the capture's kernel
(:class:`rapids_attn.extract.maps.LayerReducer`) and :func:`rapids_attn.extract.maps.map_signature` are held to
them. Each works on one example's [head, n, n] maps and builds its [n, n] pattern outright.

Imported by the tests as ``from detector_reference import ...`` (pytest puts ``tests/`` on the path).
"""

from __future__ import annotations

import torch

from rapids_attn.extract.maps import SignatureWeights, map_signature, repeat_masks
from rapids_attn.extract.signature import RECENT_WINDOW, SINK_TOKENS


def streaming_score(
    a: torch.Tensor, causal: bool, visible: torch.Tensor | None = None, sinks: torch.Tensor | None = None
) -> torch.Tensor:
    """[head, n, n] -> [head]: the plain reference of the ``streaming`` detector. ``visible`` [n, n]: the keys
    each row could see, where not every earlier (causal) or every key (windows: its window's content);
    ``sinks`` [n, SINK_TOKENS]: each row's sink tokens (windows: its window's first tokens; -1 for none),
    where not the input's first."""
    n = a.shape[-1]
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    if sinks is None:
        sink = j < SINK_TOKENS
    else:
        sink = (j[..., None] == sinks[:, None, :]).any(-1)
    near = sink | ((i - j).abs() < RECENT_WINDOW)
    if visible is None:
        visible = (j <= i) if causal else torch.ones(n, n, dtype=torch.bool)
    rows = (visible & ~near).any(-1)
    if not bool(rows.any()):
        return torch.full((a.shape[0],), float("nan"))
    return (a * near).sum(-1)[:, rows].mean(-1)


def retrieval_score(a: torch.Tensor, ids: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
    """[head, n, n] maps and their token ids [n] -> [head]: the plain reference of the ``retrieval`` detector;
    ``visible`` as for :func:`streaming_score` (a target the row could not see is no target)."""
    n = a.shape[-1]
    _, ind = repeat_masks(ids)
    far = ind & ((torch.arange(n)[:, None] - torch.arange(n)[None, :]) >= RECENT_WINDOW)
    if visible is not None:
        far = far & visible
    rows = far.any(-1)
    if not bool(rows.any()):
        return torch.full((a.shape[0],), float("nan"))
    return (a * far).sum((-2, -1)) / a[:, rows].sum((-2, -1))


def previous_token_pattern(n: int, device=None) -> torch.Tensor:
    """[n, n] bool: key i - 1 for every row i >= 1 (TransformerLens's previous-token pattern)."""
    return torch.ones(n - 1, dtype=torch.bool, device=device).diag(-1) if n > 1 else torch.zeros(n, n, dtype=torch.bool)


def detector_score(a: torch.Tensor, pattern: torch.Tensor, conditional: bool = False) -> torch.Tensor:
    """[head, n, n] maps, [n, n] bool pattern -> [head], the plain reference definition.

    TransformerLens (``conditional=False``): the mass on the pattern's positions over the map's whole
    mass; a pure pattern that every row has scores 1, a uniform map about 1/n, a map whose pattern
    has no position 0. ``conditional``: over the mass of the rows where the pattern has a position
    (TransformerLens's score divided by the share of those rows); NaN when no row has one.
    """
    hit = (a * pattern).sum((-2, -1))
    if not conditional:
        return hit / a.sum((-2, -1))
    rows = pattern.any(-1)
    if not bool(rows.any()):
        return torch.full((a.shape[0],), float("nan"), device=a.device)
    return hit / a[:, rows].sum((-2, -1))


def detector_scores(a: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[head, n, n] maps and their token ids [n] -> [head, len(DETECTOR_NAMES)] (``detector_score`` of the
    previous-token, duplicate-token and induction patterns, then the last two conditional)."""
    n = a.shape[-1]
    none = torch.zeros(n, dtype=torch.bool, device=a.device)
    return map_signature(a, SignatureWeights.build(none, none, False, ids.to(a.device)))[1]

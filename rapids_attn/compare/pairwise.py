"""Two models' attention maps of the same inputs compared head by head, without a T x T map (issue 37).

For every example, layer and head, over the example's real query rows (padding excluded):

- **cosine** of the two flattened maps (Kovaleva et al. 2019, "Revealing the dark secrets of BERT", section 5:
  each head's map before and after fine-tuning, flattened): ``sum p q / sqrt(sum p^2 sum q^2)``;
- **Jensen-Shannon divergence**, the mean over the rows of ``H(M) - (H(P) + H(Q)) / 2`` with ``M = (P + Q) / 2``,
  in nats, 0 log 0 = 0 (Clark et al. 2019's head distance, as :mod:`rapids_attn.relevance.atlas` computes it
  between two heads of one model; here between one head of two models).

The two models run one after the other on the same batch, both through the blocked capture
(:mod:`rapids_attn.extract.blocked`), each keeping every layer's scaled queries and keys and its mask
(:class:`QueryKeys`: linear in the length; the forward itself runs the base attention: SDPA, also where the
job extracts with ``attention_base: capture``, whose own softmax saves work only for a sink that reads rows,
:func:`forward_base`). Then,
layer by layer and block by block of query rows, both models' weights for the same rows are computed from their
queries and keys by one function (:meth:`LayerQK.rows`, the blocked path's general masking) and the sums over the
block are taken (:func:`pair_sums`). Neither model's whole ``[T, T]`` map exists at any time; the cost is two
forwards and, per block, two products of queries and keys, two softmaxes and the pairwise sums, all into four
reused block buffers (on the CPU a fresh block is fresh memory whose first writes page fault: reusing them took
the pairwise pass from 0.78x to 0.67x of one model's extraction, docs/benchmarks.md).

A model compared with itself gives cosine 1 and divergence 0 exactly: both sides of every block are the same
operations on the same values.

Map-to-map measures need the two models to see the same tokens: :func:`check_same_tokens` refuses in one line
a pair whose tokenizers differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.special import entr

from rapids_attn.errors import ModelError
from rapids_attn.extract.maps import SinkNeeds

#: the most one block of weights (a batch's heads x rows x keys, float32) may take, per model
BLOCK_BYTES = 32 << 20


def forward_base(attention_base: str) -> str:
    """The attention the compared models' forwards run over, for a job's ``extract.attention_base``: the base
    itself, but SDPA for ``capture`` (the capture's own softmax gives a layer's output from the blocks of
    weights it reads anyway; a comparison's forward keeps queries and keys and reads no block)."""
    from rapids_attn.extract.blocked import OWN

    return "sdpa" if attention_base == OWN else attention_base


def check_same_tokens(name_a: str, tok_a, name_b: str, tok_b, texts: list) -> None:
    """Refuse, in one line, two tokenizers that would give the models different tokens: a different vocabulary,
    or a different encoding of any of ``texts`` (the inputs themselves: a lower-casing or normalisation difference
    shows there). Map-to-map measures pair row t of one model's map with row t of the other's."""
    why = None
    if tok_a.get_vocab() != tok_b.get_vocab():
        why = "their vocabularies differ"
    else:
        for text in texts:
            pair = tuple(text) if isinstance(text, list | tuple) else (text,)
            if tok_a(*pair)["input_ids"] != tok_b(*pair)["input_ids"]:
                why = f"they encode {str(pair[0])[:40]!r} differently"
                break
    if why is not None:
        raise ModelError(
            f"compare: {name_a} and {name_b} tokenize the inputs differently ({why}); map-to-map measures "
            "(cosine, Jensen-Shannon) need the same tokens: compare these models on their per-map statistics only"
        )


@dataclass
class LayerQK:
    """One layer of the first model: what its blocked attention function computed before its blocks."""

    q: torch.Tensor  # [b, h, T, d] float32, already scaled
    k: torch.Tensor  # [b, h, kv, d] float32 (a key head per query head)
    mask: torch.Tensor | None
    causal: bool
    window: int | None
    softcap: float | None
    sinks: torch.Tensor | None  # [1, h, 1, 1] float32 sink logits, or None

    def rows(self, r0: int, r1: int, scores: torch.Tensor | None = None, out: torch.Tensor | None = None):
        """This layer's weights for query rows r0 .. r1 - 1, [b, h, rows, kv]: the softmax of the masked scores
        (hidden keys score :data:`~rapids_attn.extract.blocks.MASKED`, so their weight is exactly 0). ``scores``
        and ``out``, [b, h, rows, kv] float32, are where the scores and the weights go (the caller's reused
        buffers: on the CPU a fresh block is fresh memory, its first writes page faults); fresh ones without."""
        from rapids_attn.extract.blocks import mask_rows

        s = torch.matmul(self.q[:, :, r0:r1], self.k.transpose(-1, -2), out=scores)
        if self.softcap:
            s.div_(self.softcap).tanh_().mul_(self.softcap)
        q_len, kv_len = self.q.shape[2], self.k.shape[2]
        hide = mask_rows(s, self.mask, r0, q_len, kv_len, self.causal, self.window)
        if self.sinks is None:  # one fused pass; a row that sees no key (padding only) comes out uniform
            return torch.softmax(s, -1, out=out) if out is not None else torch.softmax(s, -1)
        # the sink logit is one more term of the denominator, as in the model's own kernel
        top = torch.maximum(s.amax(-1, keepdim=True), self.sinks)
        w = s.sub_(top).clamp_(min=-80.0).exp_()
        if hide is not None:
            w.masked_fill_(hide, 0.0)
        w = w.div_(w.sum(-1, keepdim=True).add_(torch.exp(self.sinks - top)))
        return out.copy_(w) if out is not None else w


@dataclass
class QueryKeys:
    """A sink for the blocked attention function that takes each layer's queries and keys instead of its rows
    (``needs.qk``): the first model's half of a comparison. The blocked attention function hands over what it
    computed before its blocks (:meth:`add_qk`), never importing this module."""

    layers: dict[int, LayerQK] = field(default_factory=dict)
    head_list = None
    block_bytes = BLOCK_BYTES
    needs = SinkNeeds(rows=False, qk=True)

    def wants(self, layer: int) -> bool:
        return True

    def add_qk(self, layer: int, **qk) -> None:
        """``q``, ``k``, ``mask``, ``causal``, ``window``, ``softcap``, ``sinks``: :class:`LayerQK`'s fields."""
        self.layers[layer] = LayerQK(**qk)

    def add_rows(self, *args, **kwargs) -> None:  # needs.rows is False: never called with rows
        pass

    def end_layer(self, layer: int) -> None:
        pass


def pair_sums(a: QueryKeys, b: QueryKeys, lengths: torch.Tensor, block_bytes: int = BLOCK_BYTES):
    """Both models' weights, block by block of query rows, summed per example, layer and head over the real rows
    (``lengths``: each example's tokens; a padding row counts nothing, whatever it holds): (cosine, mean
    Jensen-Shannon divergence), each [batch, layers, heads] float64 on the host. The sums stay on the device
    until the end: one copy per batch."""
    from rapids_attn.extract.maps import block_rows

    layers = sorted(a.layers)
    if layers != sorted(b.layers) or not layers:
        raise ModelError(f"compare: the two models captured layers {layers} and {sorted(b.layers)}; they must match")
    first = a.layers[layers[0]]
    n, h, dev = first.q.shape[0], first.q.shape[1], first.q.device
    shortest = int(lengths.min())  # rows past it are some example's padding (one host read per batch)
    shape = (n, max(layers) + 1, h)
    dot, norm_a, norm_b, js_sum = (torch.zeros(shape, dtype=torch.float64, device=dev) for _ in range(4))
    f64 = torch.float64
    buffers = None  # the scores, both models' weights and one product: four blocks, reused by every block
    for layer in layers:
        la, lb = a.layers[layer], b.layers[layer]
        if la.q.shape != lb.q.shape or la.k.shape != lb.k.shape:
            raise ModelError(
                f"compare: layer {layer}'s queries and keys differ in shape ({tuple(la.q.shape)} against "
                f"{tuple(lb.q.shape)}); map-to-map measures need the same heads and tokens"
            )
        t, kv = la.q.shape[2], la.k.shape[2]
        rows = min(block_rows(n, 2 * h, kv, block_bytes), t)  # both models' blocks at once
        if buffers is None or buffers.shape[3] < rows or buffers.shape[4] != kv:
            buffers = torch.empty((4, n, h, rows, kv), dtype=torch.float32, device=dev)
        for r0 in range(0, t, rows):
            r1 = min(r0 + rows, t)
            s, pa, pb, tmp = (x[:, :, : r1 - r0] for x in buffers)
            pa, pb = la.rows(r0, r1, s, pa), lb.rows(r0, r1, s, pb)  # [n, h, rows, kv]
            if r1 > shortest:  # a padding row counts nothing, whatever it holds
                pad = (torch.arange(r0, r1, device=dev)[None, :] >= lengths[:, None])[:, None, :, None]
                pa.masked_fill_(pad, 0.0)
                pb.masked_fill_(pad, 0.0)
            # per row in float32 (a row is at most T terms), summed over the rows in float64; every product
            # goes into the one buffer
            dot[:, layer] += torch.mul(pa, pb, out=tmp).sum(-1).sum(-1, dtype=f64)
            norm_a[:, layer] += torch.mul(pa, pa, out=tmp).sum(-1).sum(-1, dtype=f64)
            norm_b[:, layer] += torch.mul(pb, pb, out=tmp).sum(-1).sum(-1, dtype=f64)
            # entr(p) = -p log p (0 at 0): H(M) - (H(P) + H(Q)) / 2, per row
            half = entr(pa, out=tmp).sum(-1).add_(entr(pb, out=tmp).sum(-1)).mul_(0.5)
            m = pa.add_(pb).mul_(0.5)  # pa is not needed after this
            js = entr(m, out=tmp).sum(-1).sub_(half)
            js_sum[:, layer] += js.clamp_min_(0.0).sum(-1, dtype=f64)
    same = norm_a == norm_b  # identical maps: dot / sqrt(n^2) is dot / n, exactly
    denom = torch.where(same, norm_a, torch.sqrt(norm_a) * torch.sqrt(norm_b))
    cos = torch.where(denom > 0, dot / denom.clamp_min(1e-300), torch.ones_like(denom)).clamp_(-1.0, 1.0)
    js_mean = js_sum / lengths.clamp_min(1).to(torch.float64)[:, None, None]
    return cos.cpu(), js_mean.cpu()


def compare_batch(capture_a, capture_b, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch through both models (:class:`rapids_attn.extract.capture.AttentionCapture`, each model loaded
    with the blocked capture): (cosine, mean Jensen-Shannon divergence), each [batch, layers, heads]."""
    a, b = QueryKeys(), QueryKeys()
    capture_a.run(batch, a)
    capture_b.run(batch, b)
    return pair_sums(a, b, batch["attention_mask"].sum(-1))

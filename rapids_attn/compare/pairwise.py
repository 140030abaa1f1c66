"""Two models' attention maps of the same inputs compared head by head, without a T x T map (issue 37).

For every example, layer and head, over the example's real query rows (padding excluded):

- **cosine** of the two flattened maps (Kovaleva et al. 2019, "Revealing the dark secrets of BERT", section 5:
  each head's map before and after fine-tuning, flattened): ``sum p q / sqrt(sum p^2 sum q^2)``;
- **Jensen-Shannon divergence**, the mean over the rows of ``H(M) - (H(P) + H(Q)) / 2`` with ``M = (P + Q) / 2``,
  in nats, 0 log 0 = 0 (Clark et al. 2019's head distance, as :mod:`rapids_attn.relevance.atlas` computes it
  between two heads of one model; here between one head of two models).

The two models run one after the other on the same batch, both through the blocked capture
(:mod:`rapids_attn.extract.blocked`), each keeping every layer's scaled queries and keys and its mask
(:class:`QueryKeys`: linear in the length; the forward itself runs the base attention, SDPA by default). Then,
layer by layer and block by block of query rows, both models' weights for the same rows are computed from their
queries and keys by one function (:meth:`LayerQK.rows`, the blocked path's general masking) and the sums over the
block are taken (:func:`pair_sums`). Neither model's whole ``[T, T]`` map exists at any time; the cost is two
forwards and, per block, two products of queries and keys and the pairwise sums.

A model compared with itself gives cosine 1 and divergence 0 exactly: both sides of every block are the same
operations on the same values.

Map-to-map measures need the two models to see the same tokens: :func:`check_same_tokens` refuses in one line
a pair whose tokenizers differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rapids_attn.errors import ModelError

#: the most one block of weights (a batch's heads x rows x keys, float32) may take, per model
BLOCK_BYTES = 32 << 20


def _xlogx(p: torch.Tensor) -> torch.Tensor:
    return torch.xlogy(p, p)


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

    def rows(self, r0: int, r1: int) -> torch.Tensor:
        """This layer's weights for query rows r0 .. r1 - 1, [b, h, rows, kv], as the blocked path computes them."""
        from rapids_attn.extract.blocked import mask_rows

        s = torch.matmul(self.q[:, :, r0:r1], self.k.transpose(-1, -2))
        if self.softcap:
            s = torch.tanh(s / self.softcap) * self.softcap
        q_len, kv_len = self.q.shape[2], self.k.shape[2]
        hide = mask_rows(s, self.mask, r0, q_len, kv_len, self.causal, self.window)
        top = s.amax(-1, keepdim=True)
        if self.sinks is not None:
            top = torch.maximum(top, self.sinks)
        w = s.sub_(top).clamp_(min=-80.0).exp_()  # in place: one block's buffer throughout
        if hide is not None:
            w.masked_fill_(hide, 0.0)
        z = w.sum(-1, keepdim=True)
        if self.sinks is not None:
            z = z + torch.exp(self.sinks - top)
        return w.div_(z)


@dataclass
class QueryKeys:
    """A sink for the blocked attention function that takes each layer's queries and keys instead of its rows
    (``takes_qk``): the first model's half of a comparison."""

    layers: dict[int, LayerQK] = field(default_factory=dict)
    head_list = None
    block_bytes = BLOCK_BYTES
    takes_rows = False
    takes_qk = True

    def wants(self, layer: int) -> bool:
        return True

    def add_qk(self, layer: int, qk: LayerQK) -> None:
        self.layers[layer] = qk

    def add_rows(self, *args, **kwargs) -> None:  # takes_rows is False: never called with rows
        pass

    def end_layer(self, layer: int) -> None:
        pass


def pair_sums(a: QueryKeys, b: QueryKeys, lengths: torch.Tensor, block_bytes: int = BLOCK_BYTES):
    """Both models' weights, block by block of query rows, summed per example, layer and head over the real rows
    (``lengths``: each example's tokens; a padding row counts nothing, whatever it holds): (cosine, mean
    Jensen-Shannon divergence), each [batch, layers, heads] float64 on the host. The sums stay on the device
    until the end: one copy per batch."""
    from rapids_attn.extract.blocked import block_rows

    layers = sorted(a.layers)
    if layers != sorted(b.layers) or not layers:
        raise ModelError(f"compare: the two models captured layers {layers} and {sorted(b.layers)}; they must match")
    first = a.layers[layers[0]]
    n, h, dev = first.q.shape[0], first.q.shape[1], first.q.device
    shortest = int(lengths.min())  # rows past it are some example's padding (one host read per batch)
    shape = (n, max(layers) + 1, h)
    dot, norm_a, norm_b, js_sum = (torch.zeros(shape, dtype=torch.float64, device=dev) for _ in range(4))
    for layer in layers:
        la, lb = a.layers[layer], b.layers[layer]
        if la.q.shape != lb.q.shape or la.k.shape != lb.k.shape:
            raise ModelError(
                f"compare: layer {layer}'s queries and keys differ in shape ({tuple(la.q.shape)} against "
                f"{tuple(lb.q.shape)}); map-to-map measures need the same heads and tokens"
            )
        t, kv = la.q.shape[2], la.k.shape[2]
        rows = block_rows(n, 2 * h, kv, block_bytes)  # both models' blocks at once
        for r0 in range(0, t, rows):
            r1 = min(r0 + rows, t)
            pa, pb = la.rows(r0, r1), lb.rows(r0, r1)  # [n, h, rows, kv]
            if r1 > shortest:  # a padding row counts nothing, whatever it holds (a row that sees no key is NaN)
                pad = torch.arange(r0, r1, device=dev)[None, :] >= lengths[:, None]  # [n, rows]
                pa.masked_fill_(pad[:, None, :, None], 0.0)
                pb.masked_fill_(pad[:, None, :, None], 0.0)
            # per row in float32 (a row is at most T terms), summed over the rows in float64
            dot[:, layer] += torch.linalg.vecdot(pa, pb).sum(-1, dtype=torch.float64)
            norm_a[:, layer] += torch.linalg.vecdot(pa, pa).sum(-1, dtype=torch.float64)
            norm_b[:, layer] += torch.linalg.vecdot(pb, pb).sum(-1, dtype=torch.float64)
            # (sum p log p + sum q log q) / 2 - sum m log m = H(M) - (H(P) + H(Q)) / 2, per row
            half = torch.xlogy(pa, pa).sum(-1).add_(torch.xlogy(pb, pb).sum(-1)).mul_(0.5)
            m = pa.add_(pb).mul_(0.5)  # pa is not needed after this
            js = half.sub_(torch.xlogy(m, m, out=m).sum(-1))
            js_sum[:, layer] += js.clamp_min_(0.0).sum(-1, dtype=torch.float64)
            del pa, pb
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

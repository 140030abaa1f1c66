"""The capture's operations per batch, counted exactly with PyTorch's dispatcher (benchmarks/op_count.py, issue 34).

On a GPU each operation is a kernel launch or a host round trip: a capture whose operations grow with the batch is
launch-bound. Op counts depend on shapes only, not on the machine or the weights, so they are tested here (timings
are not): a MiniLM-shaped BERT (6 layers x 12 heads, random weights) over the quickstart's questions, under the
default block budget, as the quickstart runs it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.op_count import OpCounter, count_bare, count_capture, extractor, minilm_shaped, save_model
from rapids_attn.data import read_examples

QUICKSTART = Path(__file__).resolve().parents[3] / "rapids_attn" / "data" / "quickstart.json"


@pytest.fixture(scope="module")
def minilm_shaped_dir(tmp_path_factory) -> Path:
    return save_model(minilm_shaped(), tmp_path_factory.mktemp("minilm-shaped") / "model")


@pytest.fixture(scope="module")
def questions() -> list[str]:
    return [e.text for e in read_examples(str(QUICKSTART))][:32]


def _batch(ex, texts: list[str]) -> dict:
    ids = [ex.tokenizer(t)["input_ids"] for t in texts]
    return {"input_ids": ids, "token_type_ids": [[0] * len(x) for x in ids]}


@pytest.mark.parametrize("attention", ["blocked", "eager"])
def test_a_batch_of_32_costs_about_the_ops_of_a_batch_of_8_and_never_waits_for_the_device(
    minilm_shaped_dir, questions, attention
):
    from transformers import AutoModel

    torch.set_num_threads(1)
    ex = extractor(minilm_shaped_dir, attention)
    bare = AutoModel.from_pretrained(minilm_shaped_dir, attn_implementation="eager").eval()
    counts = {}
    for b in (8, 32):
        batch = _batch(ex, questions[:b])
        assert len({len(x) for x in batch["input_ids"]}) > 1  # ragged: padding and length masks in play
        counts[b] = count_capture(ex, batch), count_bare(bare, ex.tokenizer, batch)
    (c8, bare8), (c32, bare32) = counts[8], counts[32]
    # the per-example loop made a batch of 32 cost 10.3x a batch of 8 (issue 34); now the ops do not grow with it
    assert c32.not_views <= 1.5 * c8.not_views, (c32.not_views, c8.not_views)
    # the whole capture (forward and reduction) within 20x the bare eager forward's ops (it was 662x)
    assert c32.not_views <= 20 * bare32.not_views, (c32.not_views, bare32.not_views)
    for c, bare_c in ((c8, bare8), (c32, bare32)):
        assert c.scoped_not_views > 0  # the reduction was counted
        assert c.scoped_syncs == 0, c.scoped_sync_ops  # the per-layer reduction never waits for the device
        # nor does anything else in this capture (BERT: no causal mask to read): its one sync is the model's own,
        # in the bare forward too (transformers' mask functions ask bool(padding_mask.all()) once a forward)
        assert c.syncs == bare_c.syncs == 1, (c.by_op, bare_c.by_op)


def test_the_counter_sees_host_syncs_and_views():
    """The counter itself: a scalar read and a data-dependent shape are syncs, a view is not an op that runs."""
    x = torch.arange(6.0)
    c = OpCounter()
    with c:
        with c.scope():
            float(x.sum())
            x[x > 2]
            bool(x.any())  # aten.is_nonzero: reaches the dispatcher as itself
        x.view(2, 3)
        torch.nonzero(x)
    assert c.syncs == 4 and c.scoped_syncs == 3
    assert c.by_op["view"] == 1 and c.total - c.not_views >= 1


def test_the_fused_kernel_costs_a_launch_per_layer_whatever_the_batch(tmp_path, questions):
    """The triton kernel (issue 45), counted with each launch as one op (its body runs in Triton's interpreter here,
    uncounted: on a GPU it is one kernel): one launch per layer, a batch of 32 within 1.5x the ops of a batch of 8,
    within 20x the bare eager forward, and no host sync in the reduction. A 2-layer, 1-head model of MiniLM's
    vocabulary keeps the interpreter's programs (batch x heads per layer) few; the counts do not depend on it."""
    from transformers import AutoModel

    pytest.importorskip("triton")
    torch.set_num_threads(1)
    folder = save_model(minilm_shaped(layers=2, heads=1, hidden=32), tmp_path / "model")
    ex = extractor(folder, "blocked", kernel="triton")
    bare = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    counts = {}
    for b in (8, 32):
        batch = _batch(ex, questions[:b])
        # the batch of 32's launches counted without running their bodies in the interpreter (a minute of CI): the
        # same operations, op by op, as running them (checked below on the batch of 8)
        counts[b] = count_capture(ex, batch, skip_kernel_bodies=b == 32), count_bare(bare, ex.tokenizer, batch)
    (c8, bare8), (c32, bare32) = counts[8], counts[32]
    for c, bare_c in ((c8, bare8), (c32, bare32)):
        assert c.launches == 2 and c.by_op["triton:capture_fwd"] == 2  # one per layer
        assert c.scoped_syncs == 0, c.scoped_sync_ops
        # one sync a forward beyond the model's own: the launcher reads once whether the padding mask is the same
        # for every row (fused.keys_only), and remembers it for the later layers
        assert c.syncs == bare_c.syncs + 1, (c.by_op, bare_c.by_op)
    assert ex.capture.kernel_log.by_kernel() == {"triton": [0, 1]}
    assert c32.not_views <= 1.5 * c8.not_views, (c32.not_views, c8.not_views)
    assert c32.not_views <= 20 * bare32.not_views, (c32.not_views, bare32.not_views)
    # the benchmark counts MiniLM's batches without running the launches' bodies (minutes in the interpreter): the
    # same operations, op by op, since nothing around the kernel depends on its values
    skipped = count_capture(ex, _batch(ex, questions[:8]), skip_kernel_bodies=True)
    assert skipped.by_op == c8.by_op and skipped.not_views == c8.not_views and skipped.syncs == c8.syncs

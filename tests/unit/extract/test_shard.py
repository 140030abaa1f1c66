"""The key property of extraction: an example's maps do not depend on what it is batched with.

Right padding plus the ``[:n, :n]`` crop must make an example's images, thumbnails and stats the
same whether it runs alone or padded next to longer inputs, for encoders (BERT) and causal
decoders (GPT-2, Llama) alike.
"""

from __future__ import annotations

import pytest
import torch
from detector_reference import retrieval_score, streaming_score
from helpers import make_job, write_jsonl

from rapids_attn.data.example import Example
from rapids_attn.extract.batching import tokenize
from rapids_attn.extract.maps import TokenMasks, area_resize, map_stats
from rapids_attn.extract.signature import DETECTOR_NAMES, STAT_NAMES
from rapids_attn.store.zarr_store import StoreLayout

ATOL = 1e-5
EXAMPLES = [
    Example("short", "who ran?", "ann ran."),
    Example("long", "when was the printing press invented?", "in the fifteenth century, in mainz. " * 3),
    Example("mid", "what do honeybees do?", "honeybees dance to tell the hive where the flowers are."),
    Example("tiny", "why?", "so."),
]


@pytest.fixture(
    scope="module",
    params=[(m, a) for m in ("tiny_bert_dir", "tiny_gpt2_dir", "tiny_llama_dir") for a in ("blocked", "eager")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def extractor(request, tmp_path_factory):
    """An extractor under each capture (extract.attention), with ``reference``: the same weights under eager
    attention, whose ``output_attentions`` maps the tests compare against."""
    from rapids_attn.extract.model import load_model
    from rapids_attn.extract.shard import Extractor, ShardTask
    from rapids_attn.registry import job_model

    JobConfig = job_model()

    model_name, attention = request.param
    model_dir = request.getfixturevalue(model_name)
    tmp = tmp_path_factory.mktemp("inv")
    data = write_jsonl(
        tmp / "d.jsonl",
        [{"id": e.id, "question": e.text, "context": e.text_pair, "topic": "t", "answerable": True} for e in EXAMPLES],
    )
    job = make_job(tmp, model_dir, data, extract={"image_size": 16, "thumbnail_size": 4, "attention": attention})
    layout = StoreLayout(
        n_examples=len(EXAMPLES),
        layers=[0, 1],
        heads=[0, 1],
        feature_dim=16,
        image_size=16,
        thumb_size=4,
        shard_size=6,
        stat_names=list(STAT_NAMES),
    )
    task = ShardTask.from_job(JobConfig.model_validate(job), layout, max_length=128)
    ex = Extractor(task)
    assert ex.capture.mode == ("blocked" if attention == "blocked" else "hooks")
    ex.test_name = model_name
    ex.reference = ex.model if attention == "eager" else load_model(task.model, "cpu", "float32", "eager")
    return ex


@pytest.fixture(scope="module")
def ids(extractor) -> list[list[int]]:
    tok = tokenize(extractor.tokenizer, EXAMPLES, max_length=128)
    assert not any(tok.truncated)
    lengths = tok.lengths
    assert max(lengths) >= 3 * min(lengths), lengths  # the short ones really get padded
    return tok.input_ids


def assert_same(a: dict, b: dict, i: int, j: int = 0):
    for key in ("images", "thumbnails", "stats"):
        assert torch.allclose(a[key][i], b[key][j], atol=ATOL), (key, float((a[key][i] - b[key][j]).abs().max()))


def test_batched_equals_alone(extractor, ids):
    together = extractor.run_batch(ids)
    assert together["images"].shape == (len(ids), 2, 2, 16, 16)
    assert together["thumbnails"].shape == (len(ids), 2, 2, 4, 4)
    assert together["stats"].shape == (len(ids), 2, 2, len(STAT_NAMES))
    for i, x in enumerate(ids):
        alone = extractor.run_batch([x])
        assert_same(together, alone, i)


def test_order_in_the_batch_does_not_matter(extractor, ids):
    fwd = extractor.run_batch(ids)
    rev = extractor.run_batch(ids[::-1])
    for i in range(len(ids)):
        assert_same(fwd, rev, i, len(ids) - 1 - i)


@torch.inference_mode()
def test_padding_never_enters_a_map(extractor, ids):
    """The padded member's image is the resize of its [:n, :n] crop, its stats are those of the crop,
    and (to show the test has teeth) the uncropped padded map would have given different stats."""
    model, tok = extractor.reference, extractor.tokenizer
    out = extractor.run_batch(ids)
    enc = tok.pad({"input_ids": ids}, padding=True, return_tensors="pt")
    atts = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], output_attentions=True).attentions
    masks = TokenMasks.from_ids(enc["input_ids"], extractor.sep_ids, extractor.punct_ids)
    short = min(range(len(ids)), key=lambda i: len(ids[i]))
    n, padded_len = len(ids[short]), enc["input_ids"].shape[1]
    assert n < padded_len
    alone_atts = model(input_ids=torch.tensor([ids[short]]), output_attentions=True).attentions
    for layer in (0, 1):
        crop = atts[layer][short, :, :n, :n]
        assert torch.allclose(crop, alone_atts[layer][0], atol=ATOL)
        assert torch.allclose(out["images"][short, layer], area_resize(crop, 16), atol=ATOL)
        assert torch.allclose(out["thumbnails"][short, layer], area_resize(area_resize(crop, 16), 4), atol=ATOL)
        stats = map_stats(crop, masks.sep[short, :n], masks.punct[short, :n], extractor.causal)
        assert torch.allclose(out["stats"][short, layer], stats, atol=ATOL)
        full = atts[layer][short]  # [head, L, L], padding rows included
        wrong = map_stats(full, masks.sep[short], masks.punct[short], extractor.causal)
        assert not torch.allclose(wrong, stats, atol=1e-3)


def test_short_example_image_is_resize_of_its_crop_alone(extractor, ids):
    """run_batch on a single example: image == area_resize of the model's own map of that example."""
    x = ids[-1]
    with torch.inference_mode():
        att = extractor.reference(input_ids=torch.tensor([x]), output_attentions=True).attentions
    out = extractor.run_batch([x])
    for layer in (0, 1):
        assert torch.allclose(out["images"][0, layer], area_resize(att[layer][0], 16), atol=ATOL)


def test_selected_layers_and_heads(extractor, ids):
    """A layout keeping layer 1 and head 1 only gives the matching slice of the full extraction."""
    from dataclasses import replace

    full = extractor.run_batch(ids)
    saved = extractor.layout
    try:
        extractor.layout = replace(saved, layers=[1], heads=[1])
        part = extractor.run_batch(ids)
    finally:
        extractor.layout = saved
    assert part["images"].shape == (len(ids), 1, 1, 16, 16)
    assert torch.allclose(part["images"][:, 0, 0], full["images"][:, 1, 1], atol=ATOL)
    assert torch.allclose(part["stats"][:, 0, 0], full["stats"][:, 1, 1], atol=ATOL)


def test_causal_flag_matches_the_model(extractor):
    assert extractor.causal is (extractor.test_name != "tiny_bert_dir")


@torch.inference_mode()
@pytest.mark.parametrize("small_blocks", [False, True], ids=["one-block", "3-row-blocks"])
def test_windows_give_the_band_of_each_windows_own_maps(extractor, ids, small_blocks, monkeypatch):
    """model.long_inputs: windows. An input of 3-4 windows of 16 tokens (4 shared): its maps are the reducer's
    maps of the [n, n] matrix holding, for each row, the row its owning window's own forward gives (eager,
    output_attentions), at that window's key positions; the normalised entropy divides by log(keys the row saw
    in its window). With 3-row blocks, a causal block holds fewer keys than its window."""
    from rapids_attn.extract import blocks, maps
    from rapids_attn.extract.maps import LayerReducer
    from rapids_attn.extract.windows import plan_windows, template_ends

    if small_blocks:
        for module in (blocks, maps):  # the blocked path's and the reducer's own blocks
            monkeypatch.setattr(module, "block_rows", lambda *_: 3)

    x = max(ids, key=len)
    n, width, overlap = len(x), 16, 4
    tok = tokenize(extractor.tokenizer, EXAMPLES, max_length=width, windows=True)
    i = [len(t) for t in tok.input_ids].index(n)
    got = extractor.run_windows(tok, i, width, overlap)
    types = tok.token_type_ids[i] if tok.token_type_ids is not None else None
    plan = plan_windows(x, types, width, overlap, template_ends(extractor.tokenizer), extractor.causal)
    assert len(plan.windows) >= 3 and all(len(w) <= width for w in plan.input_ids)
    dense = torch.zeros(2, 2, n, n)  # [layer, head, n, n]
    log_seen = torch.zeros(n)
    for k, w in enumerate(plan.windows):
        feed = {"input_ids": torch.tensor([plan.input_ids[k]])}
        if plan.token_type_ids is not None:
            feed["token_type_ids"] = torch.tensor([plan.token_type_ids[k]])
        att = extractor.reference(**feed, output_attentions=True).attentions
        rows = w.positions[w.owned]
        for layer in (0, 1):
            dense[layer][:, rows[:, None], w.positions[None, :]] = att[layer][0, :2, w.owned]
        log_seen[rows] = (
            torch.log(w.owned.float() + 1) if extractor.causal else torch.log(torch.tensor(float(len(w.positions))))
        )
    assert torch.allclose(dense.sum(-1), torch.ones(2, 2, n), atol=1e-5)  # every row owned exactly once
    masks = TokenMasks.from_ids(torch.tensor([x]), extractor.sep_ids, extractor.punct_ids)
    ref = LayerReducer([n], masks, [0, 1], [0, 1], 16, 4, extractor.causal, "cpu")
    for layer in (0, 1):
        ref(layer, dense[layer][None])
    norm, first_stat = STAT_NAMES.index("entropy_norm"), STAT_NAMES.index("first")
    keep = [s for s in range(len(STAT_NAMES)) if s not in (norm, first_stat)]
    torch.testing.assert_close(got["images"], ref.images, atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(got["thumbnails"], ref.thumbs, atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(got["stats"][..., keep], ref.stats[..., keep], atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(got["profile"], ref.profile, atol=ATOL, rtol=ATOL)
    # streaming and retrieval count the rows whose window shows them keys beyond the sink and the recent window
    far = [DETECTOR_NAMES.index("streaming"), DETECTOR_NAMES.index("retrieval")]
    rest = [d for d in range(len(DETECTOR_NAMES)) if d not in far]
    torch.testing.assert_close(
        got["detectors"][..., rest], ref.detectors[..., rest], atol=ATOL, rtol=ATOL, equal_nan=True
    )
    visible = torch.zeros(n, n, dtype=torch.bool)
    sinks = torch.full((n, 4), -1)
    for w in plan.windows:
        visible[w.positions[w.owned], w.span[0] : w.span[1]] = True
        sinks[w.positions[w.owned]] = w.positions[:4]
    if extractor.causal:
        visible &= torch.ones(n, n, dtype=torch.bool).tril()
    for layer in (0, 1):
        want = torch.stack(
            [
                streaming_score(dense[layer], extractor.causal, visible, sinks),
                retrieval_score(dense[layer], torch.tensor(x), visible),
            ],
            -1,
        )
        torch.testing.assert_close(got["detectors"][0, layer][..., far], want, atol=ATOL, rtol=ATOL, equal_nan=True)
    # the first token of a row is its window's first: [CLS] (position 0) on BERT, the window's first content
    # token on GPT-2, whose tokenizer adds no leading special token
    if extractor.causal:  # the tiny decoders' tokenizers add none: the later windows start on content
        assert not (sinks[:, 0] == 0).all()
    on_start = dense.gather(-1, sinks[:, :1].expand(2, 2, n, 1))[..., 0]  # [layer, head, n]
    torch.testing.assert_close(got["stats"][0, ..., first_stat], on_start.mean(-1), atol=ATOL, rtol=ATOL)
    first = 1 if extractor.causal else 0
    for layer in (0, 1):
        a = dense[layer][:, first:]
        ent = -(a * torch.log(a.clamp_min(1e-30))).sum(-1)  # [head, rows]
        want = (ent / log_seen[first:]).mean(-1)
        torch.testing.assert_close(got["stats"][0, layer, :, norm], want, atol=ATOL, rtol=ATOL)
    # the band has teeth: the maps differ from the whole input's, read in one forward
    whole = extractor.run_batch([x])
    assert not torch.allclose(whole["images"], got["images"], atol=1e-3)


@torch.inference_mode()
def test_windows_without_overlap_keep_every_statistic_finite(extractor, ids):
    """window_overlap 0: a causal window's first row is then owned and sees one key (no [CLS] before it on
    GPT-2); its normalised entropy counts as 0, never 0 / 0."""
    x = max(ids, key=len)
    tok = tokenize(extractor.tokenizer, EXAMPLES, max_length=16, windows=True)
    got = extractor.run_windows(tok, [len(t) for t in tok.input_ids].index(len(x)), 16, 0)
    assert torch.isfinite(got["stats"]).all()


def test_an_example_with_no_tokens_is_a_one_line_data_error(tiny_gpt2_dir):
    """GPT-2's tokenizer adds no special tokens: an empty text is no tokens, and no attention to capture."""
    from transformers import AutoTokenizer

    from rapids_attn.errors import DataError
    from rapids_attn.extract.shard import check_tokens

    tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    examples = [Example("a", "the cat sat"), Example("b", ""), Example("c", "")]
    lengths = tokenize(tok, examples, 64).lengths
    assert lengths[0] > 0 and lengths[1:] == [0, 0]
    with pytest.raises(DataError) as e:
        check_tokens(examples, lengths)
    assert "example 'b' (and 1 more in its shard) has no tokens" in str(e.value) and "\n" not in str(e.value)
    check_tokens(examples[:1], lengths[:1])  # text: nothing to say

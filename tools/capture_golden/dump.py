#!/usr/bin/env python
"""Golden outputs of the attention capture (rapids_attn.extract), for checking a rewrite of
rapids_attn/extract/maps.py (LayerReducer) against today's code.

    PYTHONPATH=<repo root> python tools/capture_golden/dump.py OUTFILE [--only SUBSTRING ...]

Runs a fixed set of cases through ``Extractor.run_batch`` / ``Extractor.run_windows`` of the tree on PYTHONPATH
and torch.saves ``{case name: {tensor name: tensor}}`` (images, thumbnails, stats, profile, detectors, plus
``input_lengths``) to OUTFILE. The entry ``__names__`` holds the STAT/DETECTOR/PROFILE names (for compare.py's
messages); the entry ``__errors__`` (only when some case raised) maps case name -> the error's text.
Everything is seeded: two runs on the same tree give identical files. Exit status 2 when some case raised.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import argparse
import contextlib
import json
import random
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch

SQUAD = Path(__file__).resolve().parents[3] / "shared" / "data" / "squad-v2-dev-half.json"  # ../shared beside the repo
THREADS = 2
#: the "tiny" block budget (bytes) handed to LayerReducer: a layer takes 1 .. ~40 rows per block
TINY_BLOCK_BYTES = 1 << 16
#: tiny models' weight init: larger than transformers' 0.02 so the maps are peaked, not near-uniform
INIT_RANGE = 0.25
MAX_POS = 512


# ---------------------------------------------------------------------------------------------- imports
def import_tree():
    import rapids_attn

    where = Path(rapids_attn.__file__).resolve()
    print(f"rapids_attn: {where}", flush=True)
    roots = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if roots and not any(where.is_relative_to(Path(r).resolve()) for r in roots):
        sys.exit(f"rapids_attn was imported from {where}, not from PYTHONPATH={os.environ['PYTHONPATH']}")
    return where


# ---------------------------------------------------------------------------------------------- data
def squad():
    d = json.loads(SQUAD.read_text())
    paras = [p for a in d["data"] for p in a["paragraphs"]]
    qas = [(q["question"], p["context"]) for p in paras for q in p["qas"]]
    return paras, qas


def bpe_tokenizer(paras, qas):
    """A byte-level BPE (2000 tokens) trained on fixed SQuAD text: deterministic (checked)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    texts = [p["context"] for p in paras[:300]] + [q for q, _ in qas[:1000]]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        texts, vocab_size=2000, min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=MAX_POS,
    )


def build_models(root: Path, paras, qas) -> dict[str, str]:
    """Model folders: four tiny random models (seed 0) and the real MiniLM (6 layers x 12 heads)."""
    import transformers as T

    from rapids_attn.extract.model import resolve_model_name

    minilm = resolve_model_name("minilm-l6")
    out = {}
    wp = T.AutoTokenizer.from_pretrained(minilm)
    wp.model_max_length = MAX_POS
    bpe = bpe_tokenizer(paras, qas)
    common = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    common |= {"max_position_embeddings": MAX_POS, "initializer_range": INIT_RANGE}
    ids = {"bos_token_id": bpe.bos_token_id, "eos_token_id": bpe.eos_token_id}
    specs = {
        "bert": (T.BertModel, T.BertConfig(vocab_size=wp.vocab_size, **common), wp),
        "gpt2": (
            T.GPT2Model,
            T.GPT2Config(
                vocab_size=len(bpe),
                n_positions=MAX_POS,
                n_embd=32,
                n_layer=2,
                n_head=4,
                initializer_range=INIT_RANGE,
                **ids,
            ),
            bpe,
        ),
        "llama": (T.LlamaModel, T.LlamaConfig(vocab_size=len(bpe), num_key_value_heads=2, **common, **ids), bpe),
        "mistral": (
            T.MistralModel,
            T.MistralConfig(vocab_size=len(bpe), num_key_value_heads=1, sliding_window=8, **common, **ids),
            bpe,
        ),
    }
    for name, (cls, cfg, tok) in specs.items():
        d = root / name
        torch.manual_seed(0)
        cls(cfg).save_pretrained(d)
        tok.save_pretrained(d)
        out[name] = str(d)
    out["minilm"] = minilm
    return out


# ---------------------------------------------------------------------------------------------- inputs
def batches(tok, paras, qas) -> dict[str, tuple[list[list[int]], list[list[int]] | None]]:
    """name -> (input ids, token type ids or None), ragged, from real SQuAD text."""
    from rapids_attn.data.example import Example
    from rapids_attn.extract.batching import tokenize

    rng = random.Random(1234)
    pick = rng.sample(range(len(qas)), 40)
    sel = [qas[i] for i in pick]

    def singles(texts, max_length=MAX_POS):
        t = tokenize(tok, [Example(f"s{i}", x) for i, x in enumerate(texts)], max_length)
        return t.input_ids, t.token_type_ids

    def pairs(rows, max_length):
        t = tokenize(tok, [Example(f"p{i}", q, c) for i, (q, c) in enumerate(rows)], max_length)
        return t.input_ids, t.token_type_ids

    def join(*parts):
        ids = [x for p in parts for x in p[0]]
        if all(p[1] is not None for p in parts):
            return ids, [x for p in parts for x in p[1]]
        return ids, None

    # repeated tokens: a random word sequence twice (an induction pattern, > 70 tokens), a sentence three times,
    # a question repeated, a run of one word
    words = " ".join(c for _, c in sel[:5]).split()
    r2 = random.Random(99)
    seq = " ".join(r2.choice(words) for _ in range(40))
    sentence = sel[5][1].split(". ")[0] + "."
    repeats = [
        f"{seq} {seq}",
        f"{sentence} {sentence} {sentence}",
        f"{sel[6][0]} {sel[6][0]}",
        "the " * 30 + sel[7][0],
        f"{seq} {sentence} {seq}",
    ]
    q = [s[0] for s in sel]
    out = {
        "q1": singles(q[:1]),
        "q5": singles(q[1:6]),
        "q13": singles(q[6:19]),
        "pair64_5": pairs(sel[19:24], 64),
        "pair200_1": pairs(sel[24:25], 200),
        "pair200_13": pairs(sel[25:38], 200),
        "repeat_5": singles(repeats),
    }
    # lengths 1 and 2 (the first tokens of an encoded question) among long ones and repeats
    one = singles(q[38:40])
    tiny = (
        [one[0][0][:1], one[0][1][:2], one[0][0][:2]],
        None if one[1] is None else [one[1][0][:1], one[1][1][:2], one[1][0][:2]],
    )
    mixed = join(tiny, pairs(sel[:4], 200), singles(repeats[:2]), singles(q[10:14]))
    out["mixed_13"] = mixed
    assert len(out["mixed_13"][0]) == 13, len(out["mixed_13"][0])
    return out


def long_inputs(tok, paras, qas):
    """Two inputs of ~300 tokens for windows: a question with a long context (pair), and a repeated random word
    sequence (single); tokenized whole (long_inputs: windows)."""
    from rapids_attn.data.example import Example
    from rapids_attn.extract.batching import tokenize

    ctx = " ".join(p["context"] for p in paras[40:44])
    rows = [(qas[500][0], ctx)]
    words = ctx.split()
    r = random.Random(7)
    seq = " ".join(r.choice(words) for _ in range(60))
    out = {}
    t = tokenize(tok, [Example("long_pair", q, c) for q, c in rows], 64, windows=True)
    ids = t.input_ids[0][:300]
    types = None if t.token_type_ids is None else t.token_type_ids[0][:300]
    if tok.sep_token_id is not None:  # keep the template's trailing [SEP]
        ids[-1] = tok.sep_token_id
    out["pair300"] = _Tok([ids], None if types is None else [types])
    t = tokenize(tok, [Example("long_rep", f"{seq} {seq} {seq}")], 64, windows=True)
    out["repeat"] = _Tok(t.input_ids, t.token_type_ids)
    return out


class _Tok:
    """What Extractor.run_windows reads of a Tokenized."""

    def __init__(self, input_ids, token_type_ids):
        self.input_ids, self.token_type_ids = input_ids, token_type_ids


# ---------------------------------------------------------------------------------------------- capture
MODES = {
    # name: (extract.attention, extract.attention_base, block bytes for LayerReducer or None = the default)
    "sdpa": ("blocked", "sdpa", None),
    "sdpa_tiny": ("blocked", "sdpa", TINY_BLOCK_BYTES),
    "capture": ("blocked", "capture", None),
    "capture_tiny": ("blocked", "capture", TINY_BLOCK_BYTES),
    "eager": ("eager", "sdpa", None),
}


#: how many reducers the tiny budget was handed to (a check that the patch below still reaches the Extractor)
TINY_APPLIED = [0]


@contextlib.contextmanager
def block_bytes(value):
    """LayerReducer built by the Extractor with ``block_bytes=value`` (None: as the Extractor passes it)."""
    from rapids_attn.extract import shard

    if value is None:
        yield
        return
    orig = shard.LayerReducer

    def make(*args, **kwargs):
        kwargs["block_bytes"] = value
        TINY_APPLIED[0] += 1
        return orig(*args, **kwargs)

    shard.LayerReducer = make
    try:
        yield
    finally:
        shard.LayerReducer = orig


def extractor(model_dir: str, attention: str, base: str, tmp: Path, token_budget: int = 4096):
    from rapids_attn.extract.shard import Extractor, ShardTask

    try:
        from rapids_attn.extract.signature import STAT_NAMES
    except ImportError:  # a tree from before the signature's names had their own module (issue 36)
        from rapids_attn.extract.maps import STAT_NAMES
    try:
        from rapids_attn.registry import job_model  # a tree with stages that own their sections (issue 48)

        JobConfig = job_model()
    except ImportError:
        from rapids_attn.job import JobConfig
    from rapids_attn.store.zarr_store import StoreLayout

    data = tmp / "d.jsonl"
    if not data.exists():
        data.write_text(
            json.dumps({"id": "a", "question": "q?", "context": "c.", "topic": "t", "answerable": True}) + "\n"
        )
    job = {
        "name": "golden",
        "data": {"path": str(data), "format": "jsonl", "text_fields": ["question", "context"], "id_field": "id"},
        "model": {"name": model_dir},
        "extract": {
            "image_size": 32,
            "thumbnail_size": 16,
            "token_budget": token_budget,
            "attention": attention,
            "attention_base": base,
            "device": "cpu",
        },
        "embed": {"name": "pooled", "pooled_size": 4},
        "runtime": {"cluster": "local", "n_workers": 1, "processes": False, "learn_backend": "cpu"},
        "output": {"dir": str(tmp / "run")},
    }
    cfg = JobConfig.model_validate(job)
    n_layers, n_heads = _shape(model_dir)
    layout = StoreLayout(
        n_examples=1,
        layers=list(range(n_layers)),
        heads=list(range(n_heads)),
        feature_dim=16,
        image_size=32,
        thumb_size=16,
        shard_size=16,
        stat_names=list(STAT_NAMES),
    )
    ex = Extractor(ShardTask.from_job(cfg, layout, max_length=MAX_POS))
    want = "blocked" if attention == "blocked" else "hooks"
    assert ex.capture.mode == want, (ex.capture.mode, want)
    return ex


def _shape(model_dir):
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return cfg.get("num_hidden_layers", cfg.get("n_layer")), cfg.get("num_attention_heads", cfg.get("n_head"))


def as_saved(out: dict, lengths) -> dict[str, torch.Tensor]:
    # keys as plain str (the schema's names are a str subclass, which torch.load(weights_only=True) refuses)
    saved = {k.encode().decode(): v.detach().to("cpu", copy=True).contiguous() for k, v in out.items() if v is not None}
    saved["input_lengths"] = torch.tensor(lengths, dtype=torch.long)
    return saved


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outfile")
    ap.add_argument("--only", nargs="*", default=None, help="run only cases whose name contains one of these")
    args = ap.parse_args()
    t_start = time.perf_counter()
    import_tree()
    torch.set_num_threads(THREADS)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    try:
        from rapids_attn.extract.signature import DETECTOR_NAMES, PROFILE_OFFSETS, STAT_NAMES
    except ImportError:  # a tree from before the signature's names had their own module (issue 36)
        from rapids_attn.extract.maps import DETECTOR_NAMES, PROFILE_OFFSETS, STAT_NAMES

    paras, qas = squad()
    results: dict[str, dict] = {}
    errors: dict[str, str] = {}
    timings: dict[str, float] = {}

    def run(name, fn):
        if args.only and not any(s in name for s in args.only):
            return
        t0 = time.perf_counter()
        try:
            torch.manual_seed(0)
            results[name] = fn()
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            errors[name] = f"{type(e).__name__}: {e}"
            print(f"ERROR {name}: {errors[name]}", flush=True)
            traceback.print_exc()
        timings[name] = time.perf_counter() - t0

    with tempfile.TemporaryDirectory(prefix="golden-") as tmpdir:
        tmp = Path(tmpdir)
        models = build_models(tmp / "models", paras, qas)
        for mname, mdir in models.items():
            _n_layers, n_heads = _shape(mdir)
            for mode, (attention, base, bbytes) in MODES.items():
                t0 = time.perf_counter()
                try:
                    ex = extractor(mdir, attention, base, tmp)
                except Exception as e:  # noqa: BLE001
                    errors[f"{mname}/{mode}"] = f"{type(e).__name__}: {e}"
                    print(f"ERROR {mname}/{mode}: {errors[f'{mname}/{mode}']}", flush=True)
                    traceback.print_exc()
                    continue
                full = ex.layout
                tok = ex.tokenizer
                bs = batches(tok, paras, qas)
                # the layer/head subsets: tiny models heads [1, 3] of layer [1]; MiniLM heads [0, 5, 11] of [2, 5]
                sub = ([1], [1, 3]) if n_heads == 4 else ([2, 5], [0, 5, 11])
                variants = {"": full}
                variants["sub"] = replace(full, layers=sub[0], heads=sub[1])
                variants["img8"] = replace(full, image_size=8, thumb_size=0)
                with block_bytes(bbytes):
                    for bname, (ids, types) in bs.items():
                        for vname, layout in variants.items():
                            # the subsets and image 8 on a few batches only (time)
                            if vname and bname not in ("mixed_13", "repeat_5", "pair64_5"):
                                continue
                            # MiniLM under the tiny budget (1 row per block at 13 x 200 tokens): the main batches only
                            if mname == "minilm" and bbytes and (vname or bname == "q13"):
                                continue

                            def go(ids=ids, types=types, layout=layout, ex=ex, full=full):
                                ex.layout = layout
                                try:
                                    return as_saved(ex.run_batch(ids, types), [len(x) for x in ids])
                                finally:
                                    ex.layout = full

                            run(f"{mname}/{mode}/{bname}" + (f"/{vname}" if vname else ""), go)
                    # long inputs as windows: BERT (bidirectional) and GPT-2 (causal), max_length 64, overlap 16;
                    # token budgets: every window in one forward, and two windows per forward
                    if mname in ("bert", "gpt2"):
                        longs = long_inputs(tok, paras, qas)
                        for lname, t in longs.items():
                            for budget in (4096, 128):
                                ex.extract_cfg = ex.extract_cfg.model_copy(update={"token_budget": budget})

                                def win(t=t, ex=ex):
                                    return as_saved(ex.run_windows(t, 0, 64, 16), [len(t.input_ids[0])])

                                run(f"{mname}/{mode}/win_{lname}/budget{budget}", win)
                        ex.extract_cfg = ex.extract_cfg.model_copy(update={"token_budget": 4096})
                        # windows of 128 (overlap 32): rows see keys beyond the sink tokens and the recent window
                        # (RECENT_WINDOW 64), so the streaming and retrieval detectors are defined there too
                        for lname, t in longs.items():

                            def win128(t=t, ex=ex):
                                return as_saved(ex.run_windows(t, 0, 128, 32), [len(t.input_ids[0])])

                            run(f"{mname}/{mode}/win_{lname}/len128", win128)
                        # windows with a head/layer subset and image 8
                        t = longs["pair300"]
                        for vname in ("sub", "img8"):

                            def winv(t=t, layout=variants[vname], ex=ex, full=full):
                                ex.layout = layout
                                try:
                                    return as_saved(ex.run_windows(t, 0, 64, 16), [len(t.input_ids[0])])
                                finally:
                                    ex.layout = full

                            run(f"{mname}/{mode}/win_pair300/{vname}", winv)
                if bbytes and not TINY_APPLIED[0]:
                    errors[f"{mname}/{mode}"] = (
                        "the tiny block budget never reached a LayerReducer (Extractor._reducer changed?)"
                    )
                    print(f"ERROR {mname}/{mode}: {errors[f'{mname}/{mode}']}", flush=True)
                TINY_APPLIED[0] = 0
                print(f"{mname}/{mode}: {time.perf_counter() - t0:.1f} s", flush=True)
                ex = None  # the next mode loads its own

    saved: dict = dict(results)
    saved["__names__"] = {
        "stats": list(STAT_NAMES),
        "detectors": list(DETECTOR_NAMES),
        "profile": [str(o) for o in PROFILE_OFFSETS],
    }
    if errors:
        saved["__errors__"] = errors
    # through a file object: the archive's inner folder is then "archive" whatever the file's name, so two runs
    # give byte-identical files (torch.save to a path names that folder after the file)
    with open(args.outfile, "wb") as f:
        torch.save(saved, f)
    total = time.perf_counter() - t_start
    slow = sorted(timings.items(), key=lambda kv: -kv[1])[:5]
    print("slowest cases: " + ", ".join(f"{k} {v:.1f}s" for k, v in slow))
    print(f"wrote {len(results)} cases ({len(errors)} errors) to {args.outfile} in {total:.1f} s")
    return 2 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

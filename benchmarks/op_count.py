"""``python -m benchmarks.op_count`` (from the repository root): how many operations the capture costs per batch,
against the bare forward's, counted exactly with PyTorch's own dispatcher (issue 34).

On a GPU every operation is a kernel launch (or a host round trip) of several microseconds: a capture whose
operations grow with the batch or the length is launch-bound however fast its kernels are. Counts are exact and
the same on every machine for the same shapes, so they are measured on the CPU and can be tested
(tests/unit/extract/test_op_count.py); timings are not.

:class:`OpCounter` is a ``TorchDispatchMode`` that counts every aten call made while it is active: all of them,
those that are not views (``func.is_view``: a view launches no kernel), and the host syncs, operations whose result
the host must wait for (``aten._local_scalar_dense``: ``.item()``, ``int(t)``, ``bool(t)``; and operations whose
output shape depends on the data: ``nonzero``, boolean-mask selection, ``unique``, ``repeat_interleave`` without
``output_size``). ``scope`` names a region (for instance the reducer's per-layer reduction) whose syncs are
counted apart.

The model is a MiniLM-shaped BERT (6 layers x 12 heads, hidden 384: all-MiniLM-L6-v2's shape) with random
weights, or ``--model bert-base`` (12 x 12, hidden 768); inputs are SQuAD question + context pairs of
../shared/data truncated to ``--tokens`` (128 and 512 by default), so lengths are ragged below the cap. Counted:
one batch through :meth:`rapids_attn.extract.shard.Extractor.run_batch`'s capture (the blocked capture with the
job's defaults: ``attention_base: capture``, 64 MiB blocks unless ``--block-mb``; and eager), against the bare forward of the same model (eager attention, and SDPA)
on the same padded batch. Printed as a table (``--out`` also writes the rows as JSON); recorded in docs/benchmarks.md
(its rows; the protocol: docs/decisions/2026-11-27-capture-shaped-for-gpu.md).

``--kernel triton`` (or ``both``) counts the fused kernel (extract.kernel, issue 45): each Triton launch is one
operation, as on a GPU. Where no GPU is visible the launch's body would run in Triton's interpreter (minutes a batch
at MiniLM's size), so by default it is counted and not run: the operations around it are the same whatever its
values (tests/unit/extract/test_op_count.py checks this op by op); ``--run-kernel-bodies`` runs it anyway.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "squad-v2-dev-half.json"

#: aten ops whose result the host waits for: a scalar read, or an output whose shape depends on the data
SYNC_OPS = frozenset(
    {
        "_local_scalar_dense",
        "is_nonzero",  # bool(t): reaches the dispatcher as itself
        "nonzero",
        "nonzero_static",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_consecutive",
        "unique_dim",
        "repeat_interleave",  # the Tensor-repeats overload without output_size
        "item",
    }
)


class OpCounter(TorchDispatchMode):
    """Counts every aten call while active: ``total``, ``not_views``, ``syncs``, per op name in ``by_op``, and
    the syncs made inside :meth:`scope` in ``scoped_syncs`` (with their op names in ``scoped_sync_ops``)."""

    def __init__(self, skip_kernel_bodies: bool = False):
        super().__init__()
        #: count each Triton launch without running its body (rapids_attn.extract.fused.OBSERVERS): in the
        #: interpreter a MiniLM batch's launches take minutes, and the ops around them do not depend on their values
        self.skip_kernel_bodies = skip_kernel_bodies
        self.total = 0
        self.not_views = 0
        self.syncs = 0
        self.by_op: Counter[str] = Counter()
        self.scoped_syncs = 0
        self.scoped_sync_ops: Counter[str] = Counter()
        self.scoped_not_views = 0  # the reduction's own share of not_views
        self.scoped_by_op: Counter[str] = Counter()
        self._depth = 0
        self._paused = 0  # inside a kernel launch: Triton's interpreter's own tensor work is not the capture's
        self.launches = 0

    def launch_begin(self, name: str) -> None:
        """A Triton launch (rapids_attn.extract.fused.OBSERVERS) is one operation, as on a GPU; on the CPU the
        interpreter's copies of the tensors in and out of numpy are not counted."""
        self.launches += 1
        self.total += 1
        self.not_views += 1
        self.by_op[f"triton:{name}"] += 1
        if self._depth:
            self.scoped_not_views += 1
            self.scoped_by_op[f"triton:{name}"] += 1
        self._paused += 1

    def launch_end(self) -> None:
        self._paused -= 1

    def __enter__(self):
        from rapids_attn.extract.fused import OBSERVERS

        OBSERVERS.items.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        from rapids_attn.extract.fused import OBSERVERS

        OBSERVERS.items.remove(self)
        return super().__exit__(*exc)

    @contextlib.contextmanager
    def scope(self):
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._paused:
            return func(*args, **kwargs)
        name = func.overloadpacket.__name__
        self.total += 1
        if not func.is_view:
            self.not_views += 1
            if self._depth:
                self.scoped_not_views += 1
                self.scoped_by_op[name] += 1
        self.by_op[name] += 1
        sync = name in SYNC_OPS
        if name == "repeat_interleave" and kwargs.get("output_size") is not None:
            sync = False
        if name == "index" and any(t is not None and t.dtype == torch.bool for t in args[1]):
            sync = True  # boolean-mask indexing: its shape is the mask's count
        if sync:
            self.syncs += 1
            if self._depth:
                self.scoped_syncs += 1
                self.scoped_sync_ops[name] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def reducer_scope(counter: OpCounter):
    """Count the syncs of the reducer's per-layer reduction apart: its ``add_rows`` and ``end_layer`` run inside
    ``counter.scope()`` while this is active."""
    from rapids_attn.extract.maps import LayerReducer

    add, end, sums = LayerReducer.add_rows, LayerReducer.end_layer, LayerReducer.add_sums

    def add_rows(self, *a, **k):
        with counter.scope():
            return add(self, *a, **k)

    def add_sums(self, *a, **k):
        with counter.scope():
            return sums(self, *a, **k)

    def end_layer(self, *a, **k):
        with counter.scope():
            return end(self, *a, **k)

    LayerReducer.add_rows, LayerReducer.end_layer, LayerReducer.add_sums = add_rows, end_layer, add_sums
    try:
        yield
    finally:
        LayerReducer.add_rows, LayerReducer.end_layer, LayerReducer.add_sums = add, end, sums


def minilm_shaped(layers: int = 6, heads: int = 12, hidden: int = 384, seed: int = 0):
    """A BertConfig of all-MiniLM-L6-v2's shape (or another), random weights: op counts depend on shapes only."""
    from transformers import BertConfig

    torch.manual_seed(seed)
    return BertConfig(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=512,
    )


def save_model(config, folder: Path, tokenizer_dir: Path | None = None) -> Path:
    """The model of ``config`` saved with a tokenizer (MiniLM's WordPiece, from the installed package) so the
    project's loader reads it as any local model folder."""
    from transformers import AutoTokenizer, BertModel

    from rapids_attn.extract.model import resolve_model_name

    folder.mkdir(parents=True, exist_ok=True)
    BertModel(config).eval().save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir or resolve_model_name("minilm-l6"))
    tok.save_pretrained(folder)
    return folder


def squad_pairs(n: int, data: Path = DEFAULT_DATA, seed: int = 0):
    """``n`` SQuAD (question, context) pairs, drawn at random with ``seed``."""
    import random

    from rapids_attn.data import read_examples

    examples = list(read_examples(str(data), format="squad"))
    random.Random(seed).shuffle(examples)
    return [(e.text, e.text_pair) for e in examples[:n]]


def extractor(model_dir: Path, attention: str = "blocked", block_mb: int | None = None, **extract):
    """An Extractor for the model in ``model_dir`` on the CPU, every layer and head, the default image sizes."""
    from rapids_attn.extract.shard import Extractor, ShardTask
    from rapids_attn.registry import job_model

    JobConfig = job_model()
    from rapids_attn.store.zarr_store import StoreLayout

    ex = {"attention": attention, **extract}
    if block_mb is not None:
        ex["attention_block_mb"] = block_mb
    cfg = JobConfig.model_validate(
        {
            "model": {"name": str(model_dir), "dtype": "float32"},
            "data": {"path": str(DEFAULT_DATA), "format": "squad"},
            "extract": {**ex, "device": "cpu"},
            "embed": {"name": "pooled"},
            "output": {"dir": "/tmp/op-count-unused"},
        }
    )
    from transformers import AutoConfig

    from rapids_attn.extract.signature import STAT_NAMES

    mc = AutoConfig.from_pretrained(model_dir)
    e = cfg.extract
    layout = StoreLayout(
        n_examples=1,
        layers=list(range(mc.num_hidden_layers)),
        heads=list(range(mc.num_attention_heads)),
        feature_dim=1,
        image_size=e.image_size,
        thumb_size=e.thumbnail_size,
        shard_size=1,
        stat_names=list(STAT_NAMES),
    )
    return Extractor(ShardTask.from_job(cfg, layout, max_length=512))


def encode(tokenizer, pairs, max_length: int) -> dict:
    enc = tokenizer([q for q, _ in pairs], [c for _, c in pairs], truncation="only_second", max_length=max_length)
    return {"input_ids": enc["input_ids"], "token_type_ids": enc.get("token_type_ids")}


def count_capture(ex, batch: dict, skip_kernel_bodies: bool = False) -> OpCounter:
    """One batch through the extractor's forward and capture (``run_batch``), counted."""
    counter = OpCounter(skip_kernel_bodies)
    with reducer_scope(counter), counter:
        ex.run_batch(**batch)
    return counter


def count_bare(model, tokenizer, batch: dict) -> OpCounter:
    """The same padded batch through ``model``'s plain forward, counted."""
    features = {k: v for k, v in batch.items() if v is not None}
    enc = tokenizer.pad(features, padding=True, return_tensors="pt")
    counter = OpCounter()
    with torch.inference_mode(), counter:
        model(**{k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")})
    return counter


def main(argv=None) -> None:
    import tempfile

    from transformers import AutoModel

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("minilm", "bert-base"), default="minilm")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 512])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument(
        "--text",
        choices=("pairs", "questions"),
        default="pairs",
        help="pairs: question + context truncated to each --tokens; questions: the questions alone (the quickstart's "
        "inputs, 10-30 tokens; --tokens is then ignored)",
    )
    p.add_argument(
        "--block-mb",
        type=int,
        default=None,
        help="extract.attention_block_mb for the blocked capture (default: the job's default, 64)",
    )
    p.add_argument(
        "--kernel",
        choices=("torch", "triton", "both"),
        default="torch",
        help="the blocked capture's kernel (extract.kernel); triton runs in Triton's interpreter where no GPU is "
        "visible (slow: minutes a batch for MiniLM at 512 tokens), each launch counted as one op",
    )
    p.add_argument(
        "--run-kernel-bodies",
        action="store_true",
        help="run each Triton launch's body where no GPU is visible (in the interpreter: minutes a batch); by default "
        "there it is counted and not run, which gives the same counts (tests/unit/extract/test_op_count.py)",
    )
    p.add_argument("--no-eager", action="store_true", help="leave out the eager capture's count")
    p.add_argument("--top", type=int, default=0, help="also print the N most frequent ops of each capture count")
    p.add_argument("--out", type=Path, default=None, help="also write the rows as JSON (the raw results)")
    args = p.parse_args(argv)
    rows = []
    if args.kernel != "torch" and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel is first imported
    torch.set_num_threads(1)
    shape = {"minilm": (6, 12, 384), "bert-base": (12, 12, 768)}[args.model]
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_model(minilm_shaped(*shape), Path(tmp) / "model")
        kernels = ("torch", "triton") if args.kernel == "both" else (args.kernel,)
        skip = not args.run_kernel_bodies and not torch.cuda.is_available()
        captures = [(f"blocked ({k})", extractor(folder, "blocked", args.block_mb, kernel=k)) for k in kernels]
        if not args.no_eager:
            captures.append(("eager", extractor(folder, "eager")))
        blocked = captures[0][1]
        bare = {a: AutoModel.from_pretrained(folder, attn_implementation=a).eval() for a in ("eager", "sdpa")}
        pairs = squad_pairs(max(args.batches), args.data)
        what = "question + context, truncated to the tokens" if args.text == "pairs" else "questions alone"
        budget = f"{args.block_mb} MiB" if args.block_mb else "the default 64 MiB"
        print(
            f"model: {args.model} shape (layers, heads, hidden) {shape}, random weights; SQuAD {what}; blocks of {budget}"
        )
        head = (
            "| tokens | batch | capture | ops | not views | of which the reduction | syncs (in reduction) "
            "| bare eager (not views) | bare sdpa (not views) | capture / bare eager, not views |"
        )
        print(head)
        print("|---" * (head.count("|") - 1) + "|")
        for tokens in args.tokens if args.text == "pairs" else ["questions"]:
            for b in args.batches:
                if args.text == "pairs":
                    batch = encode(blocked.tokenizer, pairs[:b], tokens)
                else:
                    ids = [blocked.tokenizer(q)["input_ids"] for q, _ in pairs[:b]]
                    batch = {"input_ids": ids, "token_type_ids": [[0] * len(x) for x in ids]}
                be, bs = (count_bare(bare[a], blocked.tokenizer, batch) for a in ("eager", "sdpa"))
                for name, ex in captures:
                    c = count_capture(ex, batch, skip)
                    print(
                        f"| {tokens} | {b} | {name} | {c.total:,} | {c.not_views:,} | {c.scoped_not_views:,} "
                        f"| {c.syncs:,} ({c.scoped_syncs:,}) "
                        f"| {be.total:,} ({be.not_views:,}) | {bs.total:,} ({bs.not_views:,}) "
                        f"| {c.not_views / be.not_views:.1f}x |"
                    )
                    rows.append(
                        {
                            "tokens": tokens,
                            "batch": b,
                            "capture": name,
                            "ops": c.total,
                            "not_views": c.not_views,
                            "reduction_not_views": c.scoped_not_views,
                            "syncs": c.syncs,
                            "reduction_syncs": c.scoped_syncs,
                            "launches": c.launches,
                            "bare_eager_not_views": be.not_views,
                            "bare_sdpa_not_views": bs.not_views,
                        }
                    )
                    if args.top:
                        print("    " + ", ".join(f"{k} {v:,}" for k, v in c.by_op.most_common(args.top)))
    if args.out is not None:
        import json

        meta = {"model": args.model, "text": args.text, "block_mb": args.block_mb, "kernel_bodies_run": not skip}
        args.out.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()

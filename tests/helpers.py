"""Shared test helpers: tiny jobs, data files, planted stores and tokenizers built inside the tests.

Imported by the tests as ``from helpers import ...`` (pytest puts ``tests/`` on the path); the
fixtures that build tiny models live in ``conftest.py`` and use these.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from rapids_attn.devices import resolve_learn_backend
from rapids_attn.job import ClusterConfig, ReduceConfig
from rapids_attn.learn import fit_store
from rapids_attn.store.zarr_store import StoreLayout, create_store, write_shard

REPO = Path(__file__).resolve().parent.parent
SHARED_SQUAD = REPO.parent / "shared" / "data" / "squad-v2-dev-half.json"

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention heads attend to the previous token, the next token, or the separator.",
    "When was the printing press invented? In the fifteenth century, in Mainz.",
    "Tide pools hold anemones, crabs and small fish between the rocks.",
    "Honeybees dance to tell the hive where the flowers are.",
] * 4


def bpe_tokenizer():
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=320, min_frequency=1, special_tokens=["<|endoftext|>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=128,
    )


def save_tiny_llama(
    out: Path, heads: int = 2, kv_heads: int = 1, positions: int = 128, causal_lm: bool = False
) -> Path:
    """The tests' tiny Llama-style decoder (2 layers, hidden 32, ``heads`` query heads on ``kv_heads`` key heads,
    seed 0) with the BPE tokenizer, saved to ``out``; ``causal_lm``: with its LM head (LlamaForCausalLM)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

    tok = bpe_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=positions,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    (LlamaForCausalLM if causal_lm else LlamaModel)(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def tiny_bert_config(vocab_size: int, **kw):
    """The tests' tiny BERT: 2 layers x 2 heads, hidden 32, 128 positions (``kw``: num_labels and the like)."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        **kw,
    )


def pair_rows(n: int = 20) -> list[dict]:
    """``n`` text pairs of very different lengths (so batches mix short and long inputs): the tests' data."""
    rows = []
    for i in range(n):
        ctx = " ".join(CORPUS[i % 5].split() * (1 + (i * 7) % 9))
        rows.append(
            {
                "id": f"q{i}",
                "question": f"question number {i} about {CORPUS[i % 5].split()[1]}?",
                "context": ctx,
                "topic": f"t{i % 3}",
                "answerable": i % 2 == 0,
            }
        )
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


#: a short sentence of repeated words: its copies give every row far repeats (the retrieval score's targets)
REPEATED_WORDS = "the cat sat on the mat and the dog ran to the park while birds sang".split()  # noqa: SIM905


def repeated_rows(n: int, repeats: int) -> list[dict]:
    """``n`` JSONL rows whose contexts repeat :data:`REPEATED_WORDS` ``repeats`` to ``repeats + 2`` times (16 words
    each): inputs long enough, and repetitive enough, for every long-context head-class score to be defined."""
    return [
        {
            "id": f"d{i}",
            "question": f"doc {i}",
            "context": " ".join(REPEATED_WORDS * (repeats + i % 3)),
            "topic": "t",
            "answerable": True,
        }
        for i in range(n)
    ]


#: the explain stage's optional outputs off: the HTML report, the explorer and the BertViz head views are
#: three quarters of a tiny job's wall clock (4.4 s against 1.6 s), and only the tests about them read them
NO_REPORT = {"report": False, "explorer": False, "head_views": 0}
#: the explain section that writes every output (what a user's job does by default)
FULL_REPORT = {"report": True, "explorer": True, "head_views": 2}


def make_job(tmp_path: Path, model_dir: Path, data: Path, **sections) -> dict:
    """A small job dict for tests: in-process workers, tiny shards, CPU learn, and the explain stage writing
    its tables and summary but not the report, explorer or head views (``explain=FULL_REPORT`` asks for them)."""
    job = {
        "name": "t",
        "data": {
            "path": str(data),
            "format": "jsonl",
            "text_fields": ["question", "context"],
            "id_field": "id",
            "group_field": "topic",
            "label_field": "answerable",
        },
        "model": {"name": str(model_dir)},
        "extract": {"image_size": 8, "thumbnail_size": 4, "shard_size": 6, "token_budget": 512},
        "embed": {"name": "pooled", "pooled_size": 4},
        "reduce": {"pca_components": 4},
        "cluster": {"method": "kmeans", "n_clusters": 3, "silhouette_sample": 200},
        "explain": dict(NO_REPORT),
        "runtime": {
            "cluster": "local",
            "n_workers": 1,
            "processes": False,
            "learn_backend": "cpu",
            "dashboard_address": ":0",
        },
        "output": {"dir": str(tmp_path / "run")},
    }
    for name, values in sections.items():
        job.setdefault(name, {}).update(values)
    return job


# -- planted stores for the learn stage (no model involved) -------------------------------------------

E, L, H, D = 60, 2, 3, 12  # 360 maps


def planted_store(tmp_path: Path, seed: int = 0):
    """Three well-separated blobs; returns the store group and the true label of every map."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 10, size=(3, D))
    truth = rng.integers(0, 3, size=(E, L, H))
    feats = centers[truth] + rng.normal(0, 0.3, size=(E, L, H, D))
    layout = StoreLayout(
        n_examples=E,
        layers=[0, 1],
        heads=[0, 1, 2],
        feature_dim=D,
        image_size=8,
        thumb_size=0,
        shard_size=16,
        stat_names=["entropy"],
        features_dtype="float32",
    )
    path = tmp_path / "store.zarr"
    ids = [f"e{i}" for i in range(E)]
    create_store(path, layout, {}, "key", {}, ids, [""] * E, [""] * E)
    for s in range(layout.n_shards):
        a, b = layout.shard_rows(s)
        write_shard(str(path), layout, s, {"features": feats[a:b].astype(np.float32)})
    return zarr.open_group(str(path), mode="r+"), truth.reshape(-1)


def learn_sections(**overrides):
    """The job's reduce and cluster sections with dotted overrides (``{"cluster.method": "dbscan"}``): the
    learn stage needs nothing else, no data file or model."""
    import yaml

    raw = {"reduce": {"pca_components": 4}, "cluster": {"n_clusters": 3}}
    for key, value in overrides.items():
        section, *path = key.split(".")
        node = raw[section]
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = yaml.safe_load(value) if isinstance(value, str) else value
    return ReduceConfig.model_validate(raw["reduce"]), ClusterConfig.model_validate(raw["cluster"])


def learn(g, backend=None, **overrides) -> dict:
    reduce, cluster = learn_sections(**overrides)
    return fit_store(g, reduce, cluster, backend or resolve_learn_backend("cpu"), seed=0)


#: the worker preload of a run the fault tests strike (tests/integration: test_faults.py, test_failures.py), with
#: ``{release}`` the path of a release file. Distributed runs it in every worker, in-process ones included, and
#: may run it more than once in a process: it wraps ``write_shard`` once. A process's first shard is written as
#: usual; every later one is computed and then held before its write, polling for the release file, so that the
#: store keeps at least one shard and at most one per process until the test releases it (or 120 s, a bound for
#: a broken test, pass). A hold also ends when its worker closes or the job process's main thread has ended
#: (a Ctrl-C'd job closing its in-process worker): the held shard is then written, as a slow worker's would be.
HOLD_PRELOAD = """
import os
import threading
import time

import rapids_attn.extract.shard as shard

RELEASE = {release!r}


def closing():
    if not threading.main_thread().is_alive():
        return True
    try:
        from distributed import get_worker

        return get_worker().status.name not in ("running", "paused")
    except ValueError:
        return False


if not hasattr(shard, "_held_write_shard"):
    shard._held_write_shard = shard.write_shard
    _lock = threading.Lock()
    _writes = []

    def held_write_shard(path, layout, s, arrays):
        with _lock:
            _writes.append(s)
            first = len(_writes) == 1
        if not first:
            deadline = time.monotonic() + 120
            while not os.path.exists(RELEASE) and not closing() and time.monotonic() < deadline:
                time.sleep(0.02)
        shard._held_write_shard(path, layout, s, arrays)

    shard.write_shard = held_write_shard
"""


@dataclass
class Hold:
    """What a struck run needs: ``env`` for :func:`start`, and :meth:`release` once the test has struck."""

    env: dict
    path: Path

    def release(self) -> None:
        self.path.touch()


def held_after_first_shard(tmp: Path) -> Hold:
    """The environment under which each worker process of a run writes one shard and holds the rest until
    :meth:`Hold.release` (:data:`HOLD_PRELOAD`): a strike after the first shard is done lands mid-extraction
    whatever the machine's speed. Only the struck run gets it; the run that resumes runs as usual."""
    release = tmp / "hold.release"
    preload = tmp / "hold_preload.py"
    preload.write_text(HOLD_PRELOAD.format(release=str(release)))
    return Hold({"DASK_DISTRIBUTED__WORKER__PRELOAD": json.dumps([str(preload)])}, release)


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with a hash of its bytes, and every symbolic link with its target (links are
    not followed): byte-for-byte what a run must leave unchanged."""
    import hashlib
    import os

    out = {}
    for folder, dirs, files in os.walk(root):
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]):
            p = Path(folder) / name
            rel = str(p.relative_to(root))
            out[rel] = "-> " + os.readlink(p) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
    return dict(sorted(out.items()))


#: the vocabulary of the tiny attention models below (token ids drawn from it in the tests)
TINY_VOCAB = 97


def tiny_attention_model(kind: str):
    """(model class, config) of a tiny 2-layer, 4-head model of ``kind``: ``bert`` (an encoder), ``gpt2``
    (causal) or ``llama`` (grouped-query attention, 2 key heads), hidden 32, 160 positions, random weights."""
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model, LlamaConfig, LlamaModel

    if kind == "bert":
        cfg = BertConfig(
            vocab_size=TINY_VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=160,
        )
        return BertModel, cfg
    if kind == "gpt2":
        return GPT2Model, GPT2Config(vocab_size=TINY_VOCAB, n_positions=160, n_embd=32, n_layer=2, n_head=4)
    if kind == "llama":
        cfg = LlamaConfig(
            vocab_size=TINY_VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=160,
        )
        return LlamaModel, cfg
    raise ValueError(f"no tiny attention model {kind!r}")


def write_squad(path: Path, articles: int = 4, paragraphs: int = 2, questions: int = 3) -> Path:
    """A tiny SQuAD 2.0 file: ``articles`` titled articles of ``paragraphs`` contexts (CORPUS sentences), each with
    ``questions`` questions, every third unanswerable, the others answered by a word of the context with its
    character start."""
    data = []
    for a in range(articles):
        paras = []
        for p in range(paragraphs):
            context = " ".join(CORPUS[(a + p + k) % 5] for k in range(3))
            qas = []
            for q in range(questions):
                qid = f"a{a}p{p}q{q}"
                if q % 3 == 2:
                    qas.append(
                        {"id": qid, "question": "Who painted the ceiling?", "answers": [], "is_impossible": True}
                    )
                    continue
                word = context.split()[1 + 2 * q]
                qas.append(
                    {
                        "id": qid,
                        "question": f"Which word is number {1 + 2 * q} of the story about {word}?",
                        "answers": [{"text": word, "answer_start": context.index(word)}],
                        "is_impossible": False,
                    }
                )
            paras.append({"context": context, "qas": qas})
        data.append({"title": f"Article_{a}", "paragraphs": paras})
    path.write_text(json.dumps({"version": "v2.0", "data": data}))
    return path

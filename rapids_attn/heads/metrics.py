"""Task metrics that fit the model (issue 14): what ablating or pruning a head costs is measured on the
model's own task.

``squad`` (a question-answering head: SQuAD 2.0 exact match and F1, official normalisation and no-answer
rule), ``lm`` (a causal or masked LM head: token loss), ``retrieval`` (a sentence-embedding model such as
MiniLM: question-to-paragraph recall@1 and reciprocal rank among all the data's paragraphs) and ``accuracy``
(a sequence classifier against the label). Each metric splits into ``partials`` (worker side, one shard,
under whatever hooks the caller has set: per-example arrays) and ``scores`` (driver side, every shard's
partials concatenated in example order, with the examples: per-example score arrays).
"""

from __future__ import annotations

import inspect
import zlib
from collections.abc import Sequence

import numpy as np

from rapids_attn.data.example import Example
from rapids_attn.errors import JobConfigError, ModelError
from rapids_attn.extract.batching import BatchCost, length_batches
from rapids_attn.extract.model import one_line
from rapids_attn.heads.kinds import auto_metric, head_kind, metric_for_kind  # noqa: F401 - auto_metric is this module's API
from rapids_attn.heads.squad_eval import best_span, exact_score, f1_score, gold_answer_tokens, gold_answers

TOKEN_BUDGET = 8192  # padded tokens per forward pass
MAX_BATCH = 64
MASK_RATE = 0.15
MASK_SEED = 14


def forward_inputs(model, batch: dict, device) -> dict:
    """The padded batch on ``device``, without the keys the model's forward does not name."""
    names = inspect.signature(model.forward).parameters
    return {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "attention_mask") or k in names}


def _batches(model, tokenizer, features: list[dict], device, token_budget: int):
    """(indices, padded batch, model output) over length-bucketed batches, under inference mode: on the CPU
    the extractor's least-cost grouping (:class:`rapids_attn.extract.batching.BatchCost`: one long input no
    longer pads a batch of short ones), greedy packing on a GPU or for a config without a hidden size."""
    import torch

    lengths = [len(f["input_ids"]) for f in features]
    hidden = getattr(model.config, "hidden_size", None)
    cost = BatchCost.for_model(hidden, str(device)) if isinstance(hidden, int) else None
    with torch.inference_mode():
        for idx in length_batches(lengths, token_budget, MAX_BATCH, cost=cost):
            batch = tokenizer.pad([features[i] for i in idx], padding_side="right", return_tensors="pt")
            yield idx, batch, model(**forward_inputs(model, batch, device))


def encoded_features(enc, i: int) -> dict:
    """Example ``i`` of a tokenizer's batch encoding, as the features ``tokenizer.pad`` takes."""
    return {k: enc[k][i] for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc}


def mean_ci(x: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """Mean and its Student-t confidence interval (mean +- t * sd / sqrt(n)) over the finite values of ``x``;
    NaN bounds with fewer than two values."""
    from scipy import stats

    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(x.mean())
    if x.size < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return mean, mean - half, mean + half


class TaskMetric:
    name = ""
    columns: tuple[str, ...] = ()
    headline = ""  # the column the reports rank by
    higher_is_better = True
    kinds: tuple[str, ...] = ()  # the head kinds it runs on
    needs = ""
    auto_class = "AutoModel"

    def check(self, model, tokenizer, cfg_model_name: str, data_format: str | None = None) -> None:
        """Refuse, in one line naming ``heads.metric``, a model (or config) without the head this metric
        needs, or a tokenizer it cannot use."""
        kind, cls = head_kind(model)
        if kind not in self.kinds:
            other = metric_for_kind(kind, data_format)
            fix = f"use heads.metric: {other}" if other else "choose a model with that head"
            what = f"a {cls}" if cls else "a model whose config names no architecture"
            raise JobConfigError(f"heads.metric: {self.name} needs {self.needs}; {cfg_model_name} is {what}; {fix}")

    def load_model(self, name_or_path, device="cpu", dtype="float32", **kwargs):
        """The weights under :attr:`auto_class`, in eval mode on ``device``; ``kwargs`` go to from_pretrained."""
        import torch
        import transformers

        auto = getattr(transformers, self.auto_class)
        if auto is transformers.AutoModel:  # an encoder-decoder model: its encoder alone, as extract reads it
            from rapids_attn.extract.model import model_class

            opts = {k: kwargs[k] for k in ("revision", "trust_remote_code") if k in kwargs}
            auto = model_class(transformers.AutoConfig.from_pretrained(str(name_or_path), **opts), str(name_or_path))
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        try:
            model = auto.from_pretrained(str(name_or_path), dtype=dtype, **kwargs)
        except (OSError, ValueError) as e:
            raise ModelError(f"model.name: cannot load '{name_or_path}' as {self.auto_class}: {one_line(e)}") from None
        self.check(model.config, None, str(name_or_path))  # the checkpoint's own head, not the class just built
        return model.eval().to(device)

    def partials(self, model, tokenizer, examples: list[Example], device, max_length: int, token_budget=TOKEN_BUDGET):
        raise NotImplementedError

    def scores(self, partials: dict[str, np.ndarray], examples_meta: Sequence[Example]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def scope(self, examples: Sequence[Example]) -> dict | None:
        """What a score is measured against, where that depends on the examples scored (the retrieval metric's
        candidate paragraphs); None where it does not."""
        return None

    def summary(self, partials: dict[str, np.ndarray], scores: dict[str, np.ndarray]) -> dict[str, float]:
        """Each column's mean with its 95% t interval (``<col>``, ``<col>_lo``, ``<col>_hi``)."""
        out = {}
        for col in self.columns:
            out[col], out[f"{col}_lo"], out[f"{col}_hi"] = mean_ci(scores[col])
        return out


# --------------------------------------------------------------------------------------------- squad


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


class SquadMetric(TaskMetric):
    """SQuAD 2.0 exact match and F1 (the official rules, threshold 0), and **gold_logprob**: the mean of the
    log-probabilities the model gives the gold answer's start and end tokens ([CLS] for an unanswerable question
    or an answer cut off): the negative of the training loss. Ablation costs are ranked by it (issue 46): it moves
    with every head, where F1 stays flat while the predictions do not cross over (a model that abstains on every
    question loses exactly 0 F1 to any ablation)."""

    name, columns, headline = "squad", ("exact", "f1", "gold_logprob"), "gold_logprob"
    kinds = ("qa",)
    needs = "a question-answering head (AutoModelForQuestionAnswering)"
    auto_class = "AutoModelForQuestionAnswering"
    null_threshold = 0.0  # predict no answer when null score - best span score > this

    def check(self, model, tokenizer, cfg_model_name, data_format=None):
        super().check(model, tokenizer, cfg_model_name, data_format)
        if data_format not in (None, "auto", "squad"):
            raise JobConfigError(
                f"heads.metric: squad needs SQuAD JSON data (gold answers); data.format is {data_format}"
            )
        if tokenizer is not None and not tokenizer.is_fast:
            raise JobConfigError(
                f"heads.metric: squad needs a fast tokenizer (character offsets); {cfg_model_name}'s is "
                f"{type(tokenizer).__name__}; give the model a tokenizer.json"
            )

    def _encode(self, tokenizer, examples, max_length):
        """Question first, context second, the context truncated; a question too long for that alone is
        cut too (longest first)."""
        qs, cs = [e.text for e in examples], [paired_text(e, self.name) for e in examples]
        kw = {"max_length": max_length, "return_offsets_mapping": True}
        try:
            encs = [tokenizer(qs, cs, truncation="only_second", **kw)]
            rows = [(0, i) for i in range(len(examples))]
        except Exception:  # noqa: BLE001 - the tokenizer's "sequence to truncate too short" on some question
            encs, rows = [], []
            for i, (q, c) in enumerate(zip(qs, cs, strict=True)):
                try:
                    encs.append(tokenizer([q], [c], truncation="only_second", **kw))
                except Exception:  # noqa: BLE001
                    encs.append(tokenizer([q], [c], truncation="longest_first", **kw))
                rows.append((i, 0))
        return [(encs[k], r) for k, r in rows]

    def partials(self, model, tokenizer, examples, device, max_length, token_budget=TOKEN_BUDGET):
        encoded = self._encode(tokenizer, examples, max_length)
        n = len(examples)
        out = {
            "start_char": np.full(n, -1, np.int64),
            "end_char": np.full(n, -1, np.int64),
            "span_score": np.full(n, -np.inf, np.float64),
            "null_score": np.zeros(n, np.float64),
            "gold_logprob": np.full(n, np.nan, np.float64),
        }
        features = [encoded_features(enc, r) for enc, r in encoded]
        for idx, batch, o in _batches(model, tokenizer, features, device, token_budget):
            starts, ends = o.start_logits.float().cpu().numpy(), o.end_logits.float().cpu().numpy()
            lengths = batch["attention_mask"].sum(-1).tolist()
            for row, i in enumerate(idx):
                enc, r = encoded[i]
                if gold_answers(examples[i]) is not None:  # the gold tokens' log-probability ([CLS]: no answer)
                    gs, ge = gold_answer_tokens(enc, r, examples[i].answer_span())
                    t = int(lengths[row])
                    out["gold_logprob"][i] = 0.5 * (_log_softmax(starts[row, :t])[gs] + _log_softmax(ends[row, :t])[ge])
                context = np.flatnonzero([s == 1 for s in enc.sequence_ids(r)])
                score, a, b = best_span(starts[row], ends[row], context)
                out["null_score"][i] = float(starts[row, 0]) + float(ends[row, 0])
                if a >= 0:
                    offsets = enc["offset_mapping"][r]
                    out["span_score"][i], out["start_char"][i], out["end_char"][i] = score, offsets[a][0], offsets[b][1]
        return out

    def predictions(self, partials, examples_meta: Sequence[Example]) -> list[str]:
        null = partials["null_score"] - partials["span_score"] > self.null_threshold
        return [
            "" if null[i] else (ex.text_pair or "")[partials["start_char"][i] : partials["end_char"][i]]
            for i, ex in enumerate(examples_meta)
        ]

    def scores(self, partials, examples_meta):
        """Per example: exact match (0/1) and F1 in [0, 1], max over the gold answers; NaN without gold."""
        preds = self.predictions(partials, examples_meta)
        exact, f1 = np.full(len(preds), np.nan), np.full(len(preds), np.nan)
        for i, (ex, pred) in enumerate(zip(examples_meta, preds, strict=True)):
            golds = gold_answers(ex)
            if golds is not None:
                exact[i] = max(exact_score(g, pred) for g in golds)
                f1[i] = max(f1_score(g, pred) for g in golds)
        return {"exact": exact, "f1": f1, "gold_logprob": np.asarray(partials.get("gold_logprob", f1 * np.nan))}


def paired_text(ex: Example, metric: str) -> str:
    """The example's second text (the paragraph of a question/paragraph pair), or a one-line error naming it."""
    if ex.text_pair is None:
        raise JobConfigError(
            f"heads.metric: {metric} needs question/paragraph pairs; example {ex.id} has no second text; "
            "use SQuAD JSON or name two data.text_fields"
        )
    return ex.text_pair


# ------------------------------------------------------------------------------------------------ lm


def mask_positions(candidates: np.ndarray, example_id: str, rate: float = MASK_RATE) -> np.ndarray:
    """The masked LM's positions: a seeded ``rate`` share (at least one) of ``candidates``, the same for an
    example id in every run, shard and batch."""
    if candidates.size == 0:
        return candidates
    rng = np.random.default_rng([MASK_SEED, zlib.crc32(example_id.encode())])
    k = max(1, round(rate * candidates.size))
    return np.sort(rng.choice(candidates, size=k, replace=False))


class LMMetric(TaskMetric):
    """Causal: next-token loss on every token. Masked: 15% of the non-special tokens replaced by the mask
    token (always the mask token; no 80/10/10), loss on those. Per example: the mean token loss."""

    name, columns, headline, higher_is_better = "lm", ("loss",), "loss", False
    kinds = ("causal-lm", "masked-lm")
    needs = "a causal or masked language-model head (AutoModelForCausalLM / AutoModelForMaskedLM)"

    def check(self, model, tokenizer, cfg_model_name, data_format=None):
        super().check(model, tokenizer, cfg_model_name, data_format)
        if tokenizer is not None and head_kind(model)[0] == "masked-lm" and tokenizer.mask_token_id is None:
            raise JobConfigError(
                f"heads.metric: lm on a masked LM needs a mask token; {cfg_model_name}'s tokenizer has none"
            )

    def load_model(self, name_or_path, device="cpu", dtype="float32", **kwargs):
        from transformers import AutoConfig

        opts = {k: kwargs[k] for k in ("revision", "trust_remote_code") if k in kwargs}
        kind = head_kind(AutoConfig.from_pretrained(str(name_or_path), **opts))[0]
        self.auto_class = "AutoModelForMaskedLM" if kind == "masked-lm" else "AutoModelForCausalLM"
        return super().load_model(name_or_path, device, dtype, **kwargs)

    def partials(self, model, tokenizer, examples, device, max_length, token_budget=TOKEN_BUDGET):
        import torch
        import torch.nn.functional as F

        masked = head_kind(model)[0] == "masked-lm"
        pairs = [e.text_pair for e in examples]
        texts = [e.text for e in examples]
        kw = {"truncation": True, "max_length": max_length, "return_special_tokens_mask": True}
        enc = tokenizer(texts, pairs, **kw) if all(p is not None for p in pairs) else tokenizer(texts, **kw)
        features, targets = [], []
        for i, ex in enumerate(examples):
            f = encoded_features(enc, i)
            ids = np.asarray(f["input_ids"])
            target = np.full(ids.size, -100, np.int64)
            if masked:
                where = mask_positions(np.flatnonzero(np.asarray(enc["special_tokens_mask"][i]) == 0), ex.id)
                target[where] = ids[where]
                ids = ids.copy()
                ids[where] = tokenizer.mask_token_id
                f["input_ids"] = ids.tolist()
            else:
                target[1:] = ids[1:]  # position t predicts token t + 1
            features.append(f)
            targets.append(target)
        out = {"loss_sum": np.zeros(len(examples)), "n_tokens": np.zeros(len(examples), np.int64)}
        # the loss on the logits' device: labels built on the host (numpy), one copy in per batch; the
        # per-example sums and counts stay there and come back in one copy per call (issue 34)
        order, sums, counts = [], [], []
        for idx, batch, o in _batches(model, tokenizer, features, device, token_budget):
            labels = np.full(tuple(batch["input_ids"].shape), -100, np.int64)
            for row, i in enumerate(idx):
                labels[row, : targets[i].size] = targets[i]
            labels = torch.from_numpy(labels).to(o.logits.device)
            logits = o.logits.float()
            if not masked:
                logits, labels = logits[:, :-1], labels[:, 1:]
            loss = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
            order.append(np.asarray(idx, np.int64))
            sums.append(loss.double().sum(1))
            counts.append((labels != -100).sum(1))
        if order:
            at = np.concatenate(order)
            out["loss_sum"][at] = torch.cat(sums).cpu().numpy()
            out["n_tokens"][at] = torch.cat(counts).cpu().numpy()
        return out

    def scores(self, partials, examples_meta):
        """Per example: mean token loss (NaN for an example with no scored token)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return {"loss": np.where(partials["n_tokens"] > 0, partials["loss_sum"] / partials["n_tokens"], np.nan)}

    def summary(self, partials, scores):
        """Also the corpus loss (every token weighs the same: sum / count) and its perplexity."""
        out = super().summary(partials, scores)
        count = int(partials["n_tokens"].sum())
        out["corpus_loss"] = float(partials["loss_sum"].sum() / count) if count else float("nan")
        out["corpus_perplexity"] = float(np.exp(out["corpus_loss"]))
        out["tokens"] = count
        return out


# ----------------------------------------------------------------------------------------- retrieval


class RetrievalMetric(TaskMetric):
    """Question-to-paragraph retrieval with a sentence-embedding model: mean pooling over the tokens,
    L2-normalised, cosine similarity; each question's own paragraph ranked among all distinct paragraphs."""

    name, columns, headline = "retrieval", ("recall@1", "rr"), "rr"
    kinds = ("encoder", "masked-lm", "qa", "seq-cls", "token-cls")
    needs = "an encoder to embed sentences with (a sentence-embedding model such as minilm-l6)"

    def embed(self, model, tokenizer, texts: list[str], device, max_length, token_budget=TOKEN_BUDGET) -> np.ndarray:
        """[len(texts), hidden] mean-pooled, unit-length float32 embeddings."""
        import torch

        enc = tokenizer(texts, truncation=True, max_length=max_length)
        features = [encoded_features(enc, i) for i in range(len(texts))]
        out = None
        for idx, batch, o in _batches(model, tokenizer, features, device, token_budget):
            mask = batch["attention_mask"].to(o.last_hidden_state.device).unsqueeze(-1).float()
            pooled = (o.last_hidden_state.float() * mask).sum(1) / mask.sum(1).clamp(min=1)
            pooled = torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()
            if out is None:
                out = np.zeros((len(texts), pooled.shape[1]), np.float32)
            out[idx] = pooled
        return np.zeros((0, 0), np.float32) if out is None else out

    def partials(self, model, tokenizer, examples, device, max_length, token_budget=TOKEN_BUDGET):
        """``q_emb`` and ``p_emb`` (the example's paragraph; each distinct paragraph of the shard embedded once)."""
        paragraphs = [paired_text(e, self.name) for e in examples]
        distinct = list(dict.fromkeys(paragraphs))
        where = {p: k for k, p in enumerate(distinct)}
        p_emb = self.embed(model, tokenizer, distinct, device, max_length, token_budget)
        q_emb = self.embed(model, tokenizer, [e.text for e in examples], device, max_length, token_budget)
        return {"q_emb": q_emb, "p_emb": p_emb[[where[p] for p in paragraphs]]}

    def scope(self, examples):
        """The candidates each question's paragraph is ranked among: the distinct paragraphs of the examples the
        heads stage scored (its sample), not of the whole data file; a larger pool ranks lower."""
        candidates = len({paired_text(e, self.name) for e in examples})
        return {
            "candidates": candidates,
            "pool": f"the {candidates} distinct paragraphs of the scored sample (heads.examples), not the whole data",
        }

    def scores(self, partials, examples_meta, chunk: int = 512):
        """Per example: the 1-based rank of its own paragraph among all distinct paragraphs of the scored
        examples (by text; the first embedding of each: :meth:`scope`), ties counting against it -> ``recall@1``
        (rank 1) and ``rr``."""
        paragraphs = [paired_text(e, self.name) for e in examples_meta]
        first = {}
        for i, p in enumerate(paragraphs):
            first.setdefault(p, i)
        pos = {p: k for k, p in enumerate(first)}
        own = np.array([pos[p] for p in paragraphs], np.int64)
        P = partials["p_emb"][list(first.values())].astype(np.float64)
        Q = partials["q_emb"].astype(np.float64)
        rank = np.zeros(len(paragraphs), np.int64)
        for s in range(0, len(paragraphs), chunk):
            sim = Q[s : s + chunk] @ P.T
            own_sim = sim[np.arange(sim.shape[0]), own[s : s + chunk]]
            rank[s : s + chunk] = (sim >= own_sim[:, None]).sum(1)
        return {"recall@1": (rank == 1).astype(np.float64), "rr": 1.0 / rank}


# ------------------------------------------------------------------------------------------ accuracy


def label_ids(config, examples: Sequence[Example]) -> np.ndarray:
    """Each example's label through ``config.label2id`` (exact, else case-insensitive); a label the model
    does not know is a one-line error naming it and the model's labels."""
    label2id = dict(getattr(config, "label2id", None) or {})
    folded = {str(k).lower(): v for k, v in label2id.items()}
    out = np.zeros(len(examples), np.int64)
    for i, ex in enumerate(examples):
        value = label2id.get(ex.label, folded.get(ex.label.lower()))
        if value is None:
            raise JobConfigError(
                f"heads.metric: accuracy: example {ex.id}'s label {ex.label!r} is not one of the model's labels "
                f"{sorted(label2id)}; set data.label_field to the field holding them, or choose a model trained on them"
            )
        out[i] = int(value)
    return out


class AccuracyMetric(TaskMetric):
    """Accuracy, and the **margin**: the true class's logit minus the largest other class's, per example (above 0
    exactly where the prediction is right). Ablation costs are ranked by the margin (issue 46): it moves with every
    head where accuracy, a count of flips, stays flat until a prediction crosses over."""

    name, columns, headline = "accuracy", ("accuracy", "margin"), "margin"
    kinds = ("seq-cls",)
    needs = "a sequence-classification head (AutoModelForSequenceClassification)"
    auto_class = "AutoModelForSequenceClassification"

    def partials(self, model, tokenizer, examples, device, max_length, token_budget=TOKEN_BUDGET):
        """``pred`` (argmax class), ``target`` (the label's id in ``model.config.label2id``) and ``margin`` (the
        target's logit minus the largest other logit)."""
        target = label_ids(model.config, examples)
        texts, pairs = [e.text for e in examples], [e.text_pair for e in examples]
        kw = {"truncation": True, "max_length": max_length}
        enc = tokenizer(texts, pairs, **kw) if all(p is not None for p in pairs) else tokenizer(texts, **kw)
        pred = np.zeros(len(examples), np.int64)
        margin = np.zeros(len(examples), np.float64)
        for idx, _, o in _batches(
            model, tokenizer, [encoded_features(enc, i) for i in range(len(examples))], device, token_budget
        ):
            logits = o.logits.float().cpu().numpy()
            pred[idx] = logits.argmax(-1)
            rows = np.arange(len(idx))
            own = logits[rows, target[idx]]
            logits[rows, target[idx]] = -np.inf
            margin[idx] = own - logits.max(-1)
        return {"pred": pred, "target": target, "margin": margin}

    def scores(self, partials, examples_meta):
        out = {"accuracy": (partials["pred"] == partials["target"]).astype(np.float64)}
        if "margin" in partials:
            out["margin"] = np.asarray(partials["margin"], np.float64)
        return out


METRICS = {m.name: m for m in (SquadMetric, LMMetric, RetrievalMetric, AccuracyMetric)}


def metric_for(name: str) -> TaskMetric:
    """A fresh metric by name (resolve ``auto`` first with :func:`auto_metric`)."""
    if name not in METRICS:
        raise JobConfigError(f"heads.metric: unknown metric {name!r}; choose one of {', '.join(METRICS)} or auto")
    return METRICS[name]()

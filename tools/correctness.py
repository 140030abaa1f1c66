"""Whether per-example attention statistics predict whether a model gets the example right (issue 46), for a run
of a fine-tuning job: the fine-tune on its own task, and the base on its retrieval task.

    python -m tools.correctness jobs/finetune_squad.yaml

Over the run's analysed examples (the held-out articles' sample in ``store.zarr``), each model is scored per
example: the fine-tune by its task (qa: F1 of at least 0.5 with the no-answer threshold the finetune stage chose;
classify: the right class), the base by retrieval (its paragraph ranked first among the sample's paragraphs). Each
model's own statistics (its store: the fine-tune's ``store.zarr``, the base's ``models/base/store.zarr``) then
predict that outcome (:func:`rapids_attn.compare.correctness.predicts_correct`: logistic regression, folds by
article, out-of-fold AUC with a bootstrap interval; the input's length alone and with the statistics as controls).
Writes ``correctness.json`` into the run directory and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

PARTS = ("stats", "length", "stats_and_length")


def _store_examples(cfg, store):
    """The run's analysed examples in the store's order (checked against its ids)."""
    from rapids_attn.errors import StoreError
    from rapids_attn.finetune.split import held_out_index
    from rapids_attn.store import schema as S

    index = held_out_index(cfg)
    examples = index.read(range(len(index)))
    ids = [str(v) for v in store[S.EXAMPLE_ID][:]]
    by_id = {ex.id: ex for ex in examples}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise StoreError(f"{cfg.run_dir}/store.zarr: example {missing[0]} is not among the job's held-out examples")
    return [by_id[i] for i in ids]


def finetune_right(cfg, examples) -> tuple[np.ndarray, str]:
    """(each example's 0/1 outcome for the fine-tune, what it means)."""

    from rapids_attn.extract.model import load_tokenizer
    from rapids_attn.finetune import classify, qa
    from rapids_attn.finetune.stage import finetuned_folder

    folder = finetuned_folder(cfg.run_dir)
    made = json.loads((folder / "metrics.json").read_text())
    tokenizer = load_tokenizer(cfg.model.model_copy(update={"name": str(folder), "revision": None}))
    if cfg.finetune.task == "qa":
        from transformers import AutoModelForQuestionAnswering

        model = AutoModelForQuestionAnswering.from_pretrained(str(folder)).eval()
        w = qa.QAWindowing(**made["windowing"])
        scored = qa.evaluate_qa(model, tokenizer, examples, w)
        if cfg.finetune.train_questions == "answerable":  # the task it learned: answer the answerable questions
            f1 = np.full(len(examples), np.nan)
            keep = [i for i, ex in enumerate(examples) if ex.answers]
            f1[keep] = qa.example_f1([examples[i] for i in keep], [scored["spans"][i] for i in keep])
            return np.where(np.isnan(f1), np.nan, f1 >= 50), "F1 >= 0.5 answering an answerable question"
        threshold = made["result"]["scores"].get("threshold", 0.0)
        threshold = -np.inf if threshold is None else float(threshold)  # None: the stage answered no question
        f1 = qa.example_f1(examples, qa.thresholded(scored["spans"], scored["margin"], threshold))
        return (f1 >= 50).astype(float), f"SQuAD 2.0 F1 >= 0.5 at no-answer threshold {threshold:.3f}"
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    names = [model.config.id2label[i] for i in range(len(model.config.id2label))]
    out = classify.evaluate_classifier(model, tokenizer, examples, names, cfg.finetune.max_length)
    return np.asarray(out["right"], float), "the right class"


def base_right(cfg, examples, max_length: int) -> tuple[np.ndarray, str]:
    """(each example's 0/1 retrieval outcome for the base: its paragraph ranked first among the sample's, what it
    means)."""
    import torch

    from rapids_attn.extract.model import load_model, load_tokenizer
    from rapids_attn.heads.metrics import RetrievalMetric

    metric = RetrievalMetric()
    model = load_model(cfg.model, "cpu", "float32", "eager")
    with torch.inference_mode():
        parts = metric.partials(model, load_tokenizer(cfg.model), examples, "cpu", max_length)
    r1 = metric.scores(parts, examples)["recall@1"]
    pool = len({ex.text_pair for ex in examples})
    return np.asarray(r1 > 0.5, float), f"retrieval: its paragraph ranked first among the sample's {pool}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.correctness", description=__doc__.split("\n\n")[0])
    ap.add_argument("job", help="a fine-tuning job whose run is complete (jobs/finetune_squad.yaml)")
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="change the job, as rapids_attn.run"
    )
    args = ap.parse_args(argv)

    import torch
    import zarr

    from rapids_attn.compare.correctness import predicts_correct
    from rapids_attn.errors import RapidsAttnError
    from rapids_attn.extract.signature import STAT_NAMES
    from rapids_attn.jobfile import load_job
    from rapids_attn.store import schema as S

    t0 = time.perf_counter()
    try:
        cfg = load_job(args.job, args.set)
        if not cfg.finetune.enabled:
            raise RapidsAttnError(f"{args.job}: finetune.enabled is false; this tool reads a fine-tuning job's run")
        mine = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
        base = zarr.open_group(str(cfg.run_dir / "models" / "base" / "store.zarr"), mode="r")
        examples = _store_examples(cfg, mine)
    except (RapidsAttnError, OSError, KeyError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    groups = np.asarray([ex.group for ex in examples])
    max_length = int(cfg.model.max_length or cfg.finetune.max_length)
    from rapids_attn.rundir import shared_path

    # correctness.json is shared: the job file by its name where it was given by an absolute path (issue 47)
    out = {"job": shared_path(args.job, cfg.run_dir), "examples": len(examples), "groups": len(set(groups.tolist()))}
    for label, store, outcome in (
        ("finetuned", mine, lambda: finetune_right(cfg, examples)),
        ("base", base, lambda: base_right(cfg, examples, max_length)),
    ):
        with torch.inference_mode():  # not set_grad_enabled: a caller's autograd stays as it was
            right, meaning = outcome()
        right = np.asarray(right, np.float64)
        on = np.flatnonzero(np.isfinite(right))  # the examples the outcome is defined on
        stats = store[S.STATS][: len(examples)].astype(np.float64)[on]
        lengths = store[S.SEQ_LEN][: len(examples)][on]
        right = right[on].astype(int)
        try:
            res = predicts_correct(stats, lengths, right, groups[on], list(STAT_NAMES), seed=cfg.runtime.seed)
        except ValueError as e:  # one outcome only, or one article: nothing to predict
            res = {"rate": float(np.mean(right)), "not_measured": str(e)}
        out[label] = {"outcome": meaning, **res}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    (cfg.run_dir / "correctness.json").write_text(json.dumps(out, indent=1))
    print(f"{out['examples']} examples of {out['groups']} articles; AUC out of fold (folds by article), 95% interval")
    print("| model | outcome | rate | statistics | length alone | both |")
    print("|---|---|---|---|---|---|")
    for label in ("finetuned", "base"):
        r = out[label]
        if "not_measured" in r:
            print(f"| {label} | {r['outcome']} | {r['rate']:.3f} | not measured: {r['not_measured']} | | |")
            continue
        cells = [f"{r[p]['auc']:.3f} [{r[p]['ci'][0]:.3f}, {r[p]['ci'][1]:.3f}]" for p in PARTS]
        print(f"| {label} | {r['outcome']} | {r['rate']:.3f} | {' | '.join(cells)} |")
        top = "; ".join(f"L{c['layer']}H{c['head']} {c['stat']} {c['coef']:+.3f}" for c in r["carried_by"][:5])
        print(f"  carried by: {top}")
    print(f"({out['seconds']} s; {cfg.run_dir / 'correctness.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

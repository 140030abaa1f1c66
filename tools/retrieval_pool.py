"""How much the heads stage's retrieval scores depend on their pool: each question's paragraph ranked among the
sample's paragraphs (what the heads stage measures) and among every distinct paragraph of the data file.

    python -m tools.retrieval_pool jobs/findings_minilm.yaml

The heads stage's ``retrieval`` metric (:class:`rapids_attn.heads.metrics.RetrievalMetric`) ranks each
question's own paragraph among the distinct paragraphs of the examples it scored (``heads.examples``: 80
questions, 80 paragraphs in ``jobs/findings_minilm.yaml``), because every ablated model must embed its whole
pool again. This tool measures the whole model only, with the metric's own ``embed`` and ``scores``:

- **the heads sample, its own pool**: the same questions and pool as the heads stage's whole-model row (the
  heads stage's seeded sample of the job's examples, probes left out);
- **the heads sample, the file's pool**: the same questions, ranked among every distinct paragraph of the file;
- **every question of the file, the file's pool**.

It embeds every paragraph and question of the file once (``--set`` changes the job as ``rapids_attn.run``
does; ``--max-length`` caps the tokens, the heads stage's cap by default).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def _rates(scores: dict, idx=None) -> tuple[float, float]:
    r1, rr = scores["recall@1"], scores["rr"]
    if idx is not None:
        r1, rr = r1[idx], rr[idx]
    return float(np.mean(r1)), float(np.mean(rr))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.retrieval_pool", description=__doc__.split("\n\n")[0])
    ap.add_argument("job", help="a job file whose heads stage scores retrieval (jobs/findings_minilm.yaml)")
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="change the job, as rapids_attn.run"
    )
    ap.add_argument("--max-length", type=int, default=None, help="tokens per text (default: the heads stage's)")
    args = ap.parse_args(argv)

    import torch

    from rapids_attn.data.readers import index_for
    from rapids_attn.errors import RapidsAttnError
    from rapids_attn.extract.model import DEFAULT_MAX_LENGTH_CAP, describe_model, load_model, load_tokenizer
    from rapids_attn.heads.metrics import RetrievalMetric
    from rapids_attn.jobfile import load_job
    from rapids_attn.stagekit import sample_positions

    try:
        cfg = load_job(args.job, args.set)
        job_index = index_for(cfg.data)
        if job_index.format != "squad":
            raise RapidsAttnError(
                f"data.format: {job_index.format}: {cfg.data.path} is not SQuAD JSON; the pool is SQuAD's paragraphs"
            )
        whole_index = index_for(cfg.data, whole=True)
    except RapidsAttnError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    job_examples = job_index.read(range(len(job_index)))
    groups = [e.group for e in job_examples]
    pos = sample_positions(len(groups), groups, cfg.heads.examples, cfg.runtime.seed)
    sample = [job_examples[i] for i in pos]
    every = whole_index.read(range(len(whole_index)))
    where = {e.id: i for i, e in enumerate(every)}
    in_file = np.asarray([where[e.id] for e in sample], np.int64)

    metric = RetrievalMetric()
    model = load_model(cfg.model, "cpu", "float32", "eager")
    tokenizer = load_tokenizer(cfg.model)
    limit = describe_model(cfg.model, check_files=False).max_length
    max_length = args.max_length or cfg.heads.max_length or min(limit, DEFAULT_MAX_LENGTH_CAP)
    t0 = time.perf_counter()
    with torch.inference_mode():
        whole = metric.partials(model, tokenizer, every, "cpu", max_length)
    seconds = time.perf_counter() - t0
    # the heads stage's pool: the sample's own paragraphs, embedded as the stage embeds them (the same function,
    # over the sample alone)
    with torch.inference_mode():
        own = metric.scores(metric.partials(model, tokenizer, sample, "cpu", max_length), sample)
    file_scores = metric.scores(whole, every)
    own_pool = metric.scope(sample)["candidates"]
    file_pool = metric.scope(every)["candidates"]
    rows = [
        (f"the heads sample ({len(sample)} questions)", own_pool, *_rates(own)),
        (f"the heads sample ({len(sample)} questions)", file_pool, *_rates(file_scores, in_file)),
        (f"every question of the file ({len(every):,})", file_pool, *_rates(file_scores)),
    ]
    print(
        f"{cfg.model.name}: {len(every):,} questions and {file_pool} paragraphs of {cfg.data.path} embedded in "
        f"{seconds:.0f} s (max_length {max_length}); heads sample: {len(sample)} questions, seed {cfg.runtime.seed}\n"
    )
    print("| questions | paragraphs ranked among | recall@1 | MRR |\n|---|---|---|---|")
    for name, pool, r1, rr in rows:
        print(f"| {name} | {pool} | {r1:.3f} | {rr:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""tools/retrieval_pool: the heads stage's retrieval scores against its sample's paragraphs and against the whole
file's, on the tiny BERT and a tiny SQuAD file."""

from __future__ import annotations

import yaml
import zarr
from helpers import make_job, write_squad

from rapids_attn.explain.heads import stored_result
from rapids_attn.jobfile import load_job
from rapids_attn.pipeline import run_job
from tools.retrieval_pool import main

HEADS = {
    "enabled": True,
    "metric": "retrieval",
    "examples": 6,
    "sets": ["layer"],
    "importance": False,
    "pruning": {"steps": 2, "random_orders": 1},
    "probing": {"enabled": False},
}


def _rows(out: str) -> list[list[str]]:
    table = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| questions")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table]


def test_the_sample_row_is_the_heads_stages_and_the_files_pool_ranks_lower(tmp_path, tiny_bert_dir, capsys):
    raw = make_job(tmp_path, tiny_bert_dir, write_squad(tmp_path / "squad.json", articles=6), heads=HEADS)
    raw["data"] = {"path": str(tmp_path / "squad.json"), "sample": 12, "seed": 1}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(raw))
    cfg = load_job(str(job))
    run_job(cfg, ("extract", "heads"))
    stage = stored_result(zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r"))
    assert main([str(job)]) == 0
    sample_pool, file_pool, every = _rows(capsys.readouterr().out)
    # the heads stage's own pool, reproduced: its seeded sample of the job's examples, its whole-model scores
    assert float(sample_pool[2]) == round(stage["base_columns"]["recall@1"], 3)
    assert float(sample_pool[3]) == round(stage["base_columns"]["rr"], 3)
    assert int(sample_pool[1]) == stage["scope"]["candidates"]
    # the same questions among every distinct paragraph of the file: a pool at least as large ranks no higher
    assert int(file_pool[1]) >= int(sample_pool[1]) and int(every[1]) == int(file_pool[1])
    assert float(file_pool[3]) <= float(sample_pool[3])
    assert "(36)" in every[0]  # every question of the file (6 articles x 2 paragraphs x 3 questions)


def test_a_file_that_is_not_squad_is_refused_in_one_line(tmp_path, tiny_bert_dir, capsys):
    data = tmp_path / "x.jsonl"
    data.write_text('{"question": "a", "context": "b", "id": 1, "topic": "t", "answerable": "yes"}\n')
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(make_job(tmp_path, tiny_bert_dir, data, heads=HEADS)))
    assert main([str(job)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data.format: jsonl" in err[0]

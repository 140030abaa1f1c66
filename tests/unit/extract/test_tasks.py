"""The extract stage's driver side: the shard tasks describe their rows and carry no text, whatever the texts'
length; the store it creates leaves the example metadata to the workers."""

from __future__ import annotations

import pickle

import zarr
from helpers import make_job, write_jsonl

from rapids_attn.extract.stage import ExtractStage
from rapids_attn.jobfile import load_job
from rapids_attn.pipeline import preflight
from rapids_attn.store import schema as S


def rows(n: int, scale: int) -> list[dict]:
    return [
        {
            "id": f"q{i:03d}",
            "question": f"question {i} about tide pools? " * scale,
            "context": f"honeybees dance number {i}. " * scale,
            "topic": f"t{i % 3}",
            "answerable": i % 2 == 0,
        }
        for i in range(n)
    ]


def driver_side(tmp_path, model_dir, scale: int, **data):
    path = write_jsonl(tmp_path / f"d{scale}.jsonl", rows(30, scale))
    raw = make_job(tmp_path / f"run{scale}", model_dir, path)
    raw["data"].update(data)
    cfg = load_job(None, raw=raw)
    ctx = preflight(cfg, ("extract",)).ctx
    g, resumed, tasks = ExtractStage.from_job(cfg).prepare(ctx)
    return ctx, g, resumed, tasks


def test_tasks_carry_no_text_and_do_not_grow_with_it(tmp_path, tiny_bert_dir):
    sizes = {}
    for scale in (1, 40):
        ctx, _, resumed, tasks = driver_side(tmp_path, tiny_bert_dir, scale)
        assert not resumed and len(tasks) == 5  # 30 examples, shard_size 6
        assert ctx.data.inline == () and isinstance(ctx.data.records, range)  # the driver holds no example
        blobs = [pickle.dumps(t) for t in tasks]
        for task, blob in zip(tasks, blobs):
            for ex in task.rows.read():
                for text in (ex.text, ex.text_pair):
                    assert text[:30].encode() not in blob
        sizes[scale] = [len(b) for b in blobs]
        # the store holds no metadata until the workers write it
        assert not any(zarr.open_group(str(ctx.store_path), mode="r")[S.EXAMPLE_ID][:])
    # 40x the text: the same tasks, but for the byte offsets' width (and the data file's name)
    assert all(abs(a - b) <= 32 for a, b in zip(sizes[1], sizes[40])), sizes


def test_sampled_tasks_read_the_sampled_rows(tmp_path, tiny_bert_dir):
    from rapids_attn.data import read_examples

    ctx, _, _, tasks = driver_side(tmp_path, tiny_bert_dir, 1, sample=13, seed=3)
    expected = read_examples(ctx.data.path, text_fields=["question", "context"], id_field="id", sample=13, seed=3)
    assert [e.id for t in tasks for e in t.rows.read()] == [e.id for e in expected]
    assert [t.shard for t in tasks] == [0, 1, 2]

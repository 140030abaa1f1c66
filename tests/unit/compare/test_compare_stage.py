"""The finetune and compare stages in a job (issue 37), on the tiny BERT built in the tests and a tiny SQuAD file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr
from helpers import FULL_REPORT, make_job, write_squad

from rapids_attn.explain.heads import stored_result
from rapids_attn.jobfile import load_job
from rapids_attn.pipeline import run_job
from rapids_attn.store import schema as S

FINETUNE = {
    "enabled": True,
    "max_steps": 4,
    "save_steps": 2,
    "batch_size": 4,
    "eval_batch_size": 8,
    "max_length": 64,
    "doc_stride": 16,
    "eval_fraction": 0.5,
    "learning_rate": 0.005,  # four steps that move the tiny model's maps
}
COMPARE = {"enabled": True, "examples": 6, "resamples": 100, "fit_sample": 200}
HEADS = {
    "enabled": True,
    "examples": 4,
    "sets": ["layer"],
    "importance": False,
    "pruning": {"steps": 2, "random_orders": 1},
    "probing": {"enabled": False},
}


def _squad_job(tmp_path, model_dir, **sections):
    tmp_path.mkdir(parents=True, exist_ok=True)
    raw = make_job(tmp_path, model_dir, write_squad(tmp_path / "squad.json"), **sections)
    raw["data"] = {"path": str(tmp_path / "squad.json")}
    return load_job(None, raw=raw)


def test_a_model_compared_with_itself_changes_nothing(tmp_path, tiny_bert_dir):
    import shutil

    same = tmp_path / "same"  # the same weights in another folder (compare.models naming model.name is refused)
    shutil.copytree(tiny_bert_dir, same)
    cfg = _squad_job(tmp_path, tiny_bert_dir, compare={**COMPARE, "models": [str(same)]})
    summary = run_job(cfg)
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    maps = g[S.COMPARE_MAPS][:]
    assert maps.shape == (1, 6, 2, 2, 2)
    assert (maps[..., 0] == 1).all() and (maps[..., 1] == 0).all()  # cosine 1, divergence 0, exactly
    heads = g[S.COMPARE_MAP_HEADS][:]
    assert (heads[0, 0] == 1).all() and (heads[0, 1] == 0).all()  # mean and both ends of every interval
    stat = g[S.COMPARE_STAT_HEADS][:]
    assert np.nanmax(np.abs(stat)) == 0  # every statistic and detector unchanged
    clusters = g[S.COMPARE_CLUSTER][:]
    assert (clusters[0] == clusters[1]).all()
    compared = summary["compare"]["compared"][0]
    assert compared["maps"] and compared["transitions"]["stay"] == 1.0
    assert (cfg.run_dir / "models" / compared["label"] / "store.zarr").is_dir()


@pytest.mark.budget(30, reason="a fine-tune, the compare and heads stages and the full report in one job")
def test_finetune_then_compare_with_its_base(tmp_path, tiny_bert_dir):
    from transformers import AutoModelForQuestionAnswering

    # the heads stage on the fine-tune (its metric from the task: the folder does not exist in preflight)
    # SQuAD 1.1's recipe: answerable questions only, the no-answer threshold tuned on held-back training questions
    finetune = {**FINETUNE, "train_questions": "answerable", "threshold_examples": 2}
    cfg = _squad_job(tmp_path, tiny_bert_dir, finetune=finetune, compare=COMPARE, heads=HEADS, explain=FULL_REPORT)
    summary = run_job(cfg)
    folder = cfg.run_dir / "models" / "finetuned"
    AutoModelForQuestionAnswering.from_pretrained(folder)  # an ordinary HF folder
    assert not (cfg.run_dir / "models" / "finetune-checkpoints").exists()
    made = json.loads((folder / "metrics.json").read_text())
    ft = summary["finetune"]
    assert ft["scores"] == made["metrics"]
    assert {"exact", "f1", "HasAns_f1", "NoAns_f1"} <= set(ft["scores"]) and ft["prior_work"]["f1"] == 76.29
    assert ft["train_groups"] + ft["eval_groups"] == 4
    assert ft["scores"]["threshold_from"] == 2 and "threshold_zero" in ft["scores"]
    base = ft["baseline"]  # against the overlap sentence on the answerable questions, and against abstaining
    assert base["name"].startswith("the context sentence") and base["also"]["name"] == "no answer, always"
    assert base["gain"]["examples"] == ft["scores"]["answerable_forced"]["total"] > 0
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    assert g.attrs["model"]["source"] == str(folder)
    # the later stages analysed the held-out articles only
    held = {str(x) for x in g[S.EXAMPLE_GROUP][:]}
    assert len(held) == ft["eval_groups"]
    compared = summary["compare"]["compared"][0]
    assert compared["label"] == "base" and compared["maps"]
    assert summary["head_importance"]["metric"] == "squad"
    assert all("ablation_cost" in row for row in compared["most_changed"])  # beside each head's change
    maps = g[S.COMPARE_MAPS][:]
    assert (maps[..., 0] < 1).any() and (maps[..., 1] > 0).any()  # training moved the maps
    html = (cfg.run_dir / "report" / "index.html").read_text()
    assert "What changed between models" in html and "The fine-tune" in html
    assert (cfg.run_dir / "report" / "compare_layers.png").is_file()
    # the explorer shows both models' maps of the same sample in the shared clustering, with a model menu
    explorer = (cfg.run_dir / "report" / "explorer.html").read_text()
    assert "model_select" in explorer and "maps_by_model" in explorer
    assert '"finetuned"' in explorer and '"base"' in explorer
    assert summary["explorer"]["models"] == 2
    # a second run reuses the folder (same settings) and the base's store
    again = run_job(cfg, ("finetune", "compare"))
    assert again["finetune"]["reused"] is True
    assert again["compare"]["extracted"]["base"]["shards_run"] == 0


def test_stages_after_finetune_need_its_folder(tmp_path, tiny_bert_dir):
    from rapids_attn.errors import StoreError

    cfg = _squad_job(tmp_path, tiny_bert_dir, finetune=FINETUNE)
    with pytest.raises(StoreError, match="add finetune to --stages"):
        run_job(cfg, ("extract",))


def test_an_interrupted_finetune_stage_resumes_to_the_same_weights(tmp_path, tiny_bert_dir, monkeypatch):
    """Killed after its step-2 checkpoint (the process dies in step 3), the stage resumes from that checkpoint and
    ends with the weights of a run never interrupted; the folder does not exist until it is complete."""
    import torch
    from safetensors.torch import load_file
    from transformers import Trainer

    whole = _squad_job(tmp_path / "whole", tiny_bert_dir, finetune=FINETUNE)
    run_job(whole, ("finetune",))
    cut = _squad_job(tmp_path / "cut", tiny_bert_dir, finetune=FINETUNE)
    step = Trainer.training_step
    calls = {"n": 0}

    def dies_in_step_3(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # Ctrl-C, or kill -9: nothing after this point runs
        return step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "training_step", dies_in_step_3)
    with pytest.raises(KeyboardInterrupt):
        run_job(cut, ("finetune",))
    assert not (cut.run_dir / "models" / "finetuned").exists()
    assert (cut.run_dir / "models" / "finetune-checkpoints" / "checkpoint-2").is_dir()
    monkeypatch.setattr(Trainer, "training_step", step)
    out = run_job(cut, ("finetune",))
    assert out["finetune"]["resumed_from"].endswith("checkpoint-2")
    a = load_file(whole.run_dir / "models" / "finetuned" / "model.safetensors")
    b = load_file(cut.run_dir / "models" / "finetuned" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)


def test_finetune_and_compare_refuse_what_they_cannot_do(tmp_path, tiny_bert_dir):
    from rapids_attn.errors import JobConfigError

    jsonl = make_job(tmp_path, tiny_bert_dir, tmp_path / "x.jsonl", finetune=FINETUNE)
    (tmp_path / "x.jsonl").write_text('{"text": "a b", "group": "g"}\n{"text": "c d", "group": "h"}\n')
    jsonl["data"] = {"path": str(tmp_path / "x.jsonl"), "group_field": "group"}
    with pytest.raises(JobConfigError, match="finetune.task: qa trains on SQuAD-format data"):
        run_job(load_job(None, raw=jsonl))
    cfg = _squad_job(tmp_path / "c", tiny_bert_dir, compare=COMPARE)
    with pytest.raises(JobConfigError, match="compare.models: no model to compare"):
        run_job(cfg)
    # compare.heads: the heads stage must run, and its metric must apply to the compared model (the base has no
    # question-answering head to score SQuAD with); both refused in preflight, before anything is written
    both = {**COMPARE, "heads": True}
    cfg = _squad_job(tmp_path / "d", tiny_bert_dir, finetune=FINETUNE, compare=both)
    with pytest.raises(JobConfigError, match="compare.heads: .*set heads.enabled: true"):
        run_job(cfg)
    cfg = _squad_job(tmp_path / "e", tiny_bert_dir, finetune=FINETUNE, compare=both, heads=HEADS)
    with pytest.raises(JobConfigError, match="compare.heads: model 'base' .*heads.metric: squad"):
        run_job(cfg)
    assert not (tmp_path / "e" / "runs").exists() and not cfg.run_dir.exists()


def test_compare_heads_puts_both_models_ablation_costs_beside_each_change(tmp_path, tiny_bert_dir):
    """compare.heads: the heads stage's single-head ablation runs on the compared model too, over the same examples
    with the same metric; its costs are those a job analysing that model alone finds, and the report shows both."""
    import shutil

    import torch
    from transformers import BertModel

    copy = tmp_path / "other"  # another checkpoint: every weight moved
    shutil.copytree(tiny_bert_dir, copy)
    model = BertModel.from_pretrained(copy)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * p.std().nan_to_num(0.02) * torch.randn(p.shape, generator=g))
    model.save_pretrained(copy)
    # an encoder's task both models can be scored on, over all 24 questions (a head's removal moves some ranks)
    heads = {**HEADS, "metric": "retrieval", "examples": None}
    compare = {**COMPARE, "models": [str(copy)], "heads": True}
    cfg = _squad_job(tmp_path / "run", tiny_bert_dir, compare=compare, heads=heads, explain=FULL_REPORT)
    summary = run_job(cfg)
    entry = summary["compare"]["compared"][0]
    theirs = entry["heads"]
    assert theirs["metric"] == "retrieval" and theirs["examples"] == 24
    solo = _squad_job(tmp_path / "alone", copy, heads=heads)
    run_job(solo, ("extract", "heads"))
    alone = stored_result(zarr.open_group(str(solo.run_dir / "store.zarr"), mode="r"))
    np.testing.assert_array_equal(np.asarray(theirs["cost"]), np.asarray(alone["cost"]))
    assert theirs["base"] == alone["base"]
    mine = np.asarray(stored_result(zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r"))["cost"])
    assert not np.array_equal(mine, np.asarray(theirs["cost"]))  # the changed head changes what ablation costs
    for row in entry["most_changed"]:
        assert row["compared_ablation_cost"] == theirs["cost"][row["layer"]][row["head"]]
        assert row["ablation_cost"] == mine[row["layer"], row["head"]]
    html = (cfg.run_dir / "report" / "index.html").read_text()
    assert f"ablation cost, {entry['label']}" in html and "ablation cost, " + summary["compare"]["job_model"] in html


def _one_head_changed(tmp_path, tiny_bert_dir):
    """A copy of the tiny BERT whose last layer's head 1 has new query weights."""
    import shutil

    import torch
    from transformers import BertModel

    copy = tmp_path / "copy"
    shutil.copytree(tiny_bert_dir, copy)
    model = BertModel.from_pretrained(copy)
    d = model.config.hidden_size // model.config.num_attention_heads
    with torch.no_grad():
        q = model.encoder.layer[1].attention.self.query
        q.weight[d:] = torch.randn(d, model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    model.save_pretrained(copy)
    return copy


def test_a_copy_with_one_heads_query_changed_ranks_that_head_first(tmp_path, tiny_bert_dir):
    copy = _one_head_changed(tmp_path, tiny_bert_dir)
    cfg = _squad_job(tmp_path / "run", tiny_bert_dir, compare={**COMPARE, "models": [str(copy)]})
    summary = run_job(cfg)
    top = summary["compare"]["compared"][0]["most_changed"]
    assert (top[0]["layer"], top[0]["head"]) == (1, 1)
    assert top[0]["jsd"][1] > 0 and top[0]["cosine"][2] < 1  # its interval excludes no change
    for row in top[1:]:
        assert row["jsd"] == [0.0, 0.0, 0.0] and row["cosine"] == [1.0, 1.0, 1.0]


@pytest.mark.budget(
    60, reason="four tiny fine-tunes (seeds 0, 1 and 2, and shuffled labels) and every comparison the noise floor needs"
)
def test_control_seeds_give_a_noise_floor_and_heads_called_changed_above_it(tmp_path, tiny_bert_dir):
    """Three fine-tunes (training seeds 0, 1, 2) and a shuffled-label control: each its own folder, the split and the
    data the same; the compare stage measures every pair the floor needs and calls heads changed above it."""
    finetune = {**FINETUNE, "task": "classify", "control_seeds": [1, 2], "shuffled_labels": True, "trajectory": True}
    cfg = _squad_job(tmp_path, tiny_bert_dir, finetune=finetune, compare=COMPARE, explain=FULL_REPORT)
    summary = run_job(cfg)
    ft = summary["finetune"]
    models = cfg.run_dir / "models"
    for label in ("finetuned", "finetuned-seed1", "finetuned-seed2", "finetuned-shuffled"):
        assert (models / label / "metrics.json").is_file(), label
        assert not (models / f"{label}-checkpoints").exists()
    assert [c["label"] for c in ft["controls"]] == ["finetuned-seed1", "finetuned-seed2", "finetuned-shuffled"]
    assert [c["seed"] for c in ft["controls"]] == [1, 2, 0] and ft["controls"][2]["shuffled"]
    # another seed trains other weights on the same examples
    from safetensors.torch import load_file

    a = load_file(models / "finetuned" / "model.safetensors")
    b = load_file(models / "finetuned-seed1" / "model.safetensors")
    assert any(not torch_equal(a[k], b[k]) for k in a)
    gain = ft["baseline"]["gain"]
    assert gain["ci"][0] <= gain["mean"] <= gain["ci"][1] and gain["examples"] == ft["eval_examples"]
    compare = summary["compare"]
    assert [c["label"] for c in compare["compared"]] == [
        "base",
        "finetuned-seed1",
        "finetuned-seed2",
        "finetuned-shuffled",
    ]
    assert [c["control"] for c in compare["compared"]] == [False, True, True, True]
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    pairs = g[S.COMPARE_PAIR_MAPS].attrs["pairs"]
    # the job's comparisons hold (finetuned, x) for every x; the rest of the floor's pairs are computed here
    assert sorted(map(tuple, pairs)) == sorted(
        [
            ("base", "finetuned-seed1"),
            ("base", "finetuned-seed2"),
            ("finetuned-seed1", "finetuned-seed2"),
            ("base", "finetuned-shuffled"),
            ("base", "step-2"),
            ("step-2", "finetuned"),
            ("base", "step-4"),
            ("step-4", "finetuned"),
        ]
    )
    assert g[S.COMPARE_PAIR_MAPS].shape == (8, 6, 2, 2, 2)
    floor = compare["floor"]["jsd"]
    assert floor["fine_tunes"] == ["finetuned", "finetuned-seed1", "finetuned-seed2"]
    assert floor["n_heads"] == 4 and len(floor["layers"]) == 2
    assert 0 <= floor["n_changed"] <= 4 and "control" in floor
    # the floor's change for the job's fine-tune is the job's own comparison with the base, re-read
    maps = g[S.COMPARE_MAPS][:]
    per = floor["per_fine_tune"][0]["layers"]
    np.testing.assert_allclose(per, maps[0, ..., 1].mean((0, 2)), rtol=1e-5)
    # the trajectory: the steps kept at every checkpoint (save_steps 2 of 4), each against the base and the final
    assert sorted(p.name for p in (models / "finetuned-steps").glob("step-*")) == ["step-2", "step-4"]
    t = compare["trajectory"]
    assert t["steps"] == [2, 4] and len(t["rows"]) == 2
    # the last step is the final model: no divergence from it, and the base's divergence is the final one's
    assert np.allclose(np.asarray(t["rows"][1]["to_final"]["heads"]), 0, atol=1e-6)
    np.testing.assert_allclose(t["rows"][1]["to_base"]["heads"], t["final"], rtol=1e-5, atol=1e-7)
    assert all(s in (2, 4, -1) for s in np.ravel(t["half_change_step"]))
    # whether the statistics predict correctness: the tool reads this run (tiny: whatever it can measure)
    import yaml

    from tools.correctness import main as correctness

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(cfg.to_dict()))
    assert correctness([str(job)]) == 0
    got = json.loads((cfg.run_dir / "correctness.json").read_text())
    assert got["examples"] == g[S.EXAMPLE_ID].shape[0] and {"finetuned", "base"} <= set(got)
    assert all("auc" in got[m]["stats"] or got[m]["not_measured"] for m in ("finetuned", "base"))
    html = (cfg.run_dir / "report" / "index.html").read_text()
    assert "When the changes appear" in html
    assert "Change against training noise" in html and "finetuned-seed2" in html and "beats it" in html
    assert (cfg.run_dir / "report" / "compare_floor.png").is_file()


def torch_equal(x, y) -> bool:
    import torch

    return bool(torch.equal(x, y))

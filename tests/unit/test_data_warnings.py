"""What the data index warns about reaches the user: on stderr from preflight (so --check shows it too),
once, and at the top of summary.json's warnings and the report's."""

from __future__ import annotations

import json

from helpers import make_job

from rapids_attn.jobfile import load_job
from rapids_attn.pipeline import preflight, run_job


def _squad(path, articles=8, per_article=5):
    doc = {
        "version": "v2.0",
        "data": [
            {
                "title": f"Article {a}",
                "paragraphs": [
                    {
                        "context": f"Tide pools hold anemones, crabs and small fish number {a}.",
                        "qas": [
                            {"id": f"{a}-{q}", "question": f"What do tide pools hold {q}?", "answers": []}
                            for q in range(per_article)
                        ],
                    }
                ],
            }
            for a in range(articles)
        ],
    }
    path.write_text(json.dumps(doc))
    return path


def _job(tmp_path, model, data, **data_settings):
    raw = make_job(tmp_path, model, data, explain={"report": True})
    raw["data"] = {"path": str(data), "format": "squad", **data_settings}
    return load_job(None, raw=raw)


def test_a_limit_on_squad_is_warned_in_preflight_and_in_the_summary(tmp_path, tiny_bert_dir, capsys):
    data = _squad(tmp_path / "squad.json")
    cfg = _job(tmp_path, tiny_bert_dir, data, limit=10)
    preflight(cfg)
    err = capsys.readouterr().err
    assert err.count("warning: data.limit keeps the first 10 of 40 questions") == 1
    assert "from 2 of 8 groups" in err and "data.sample: 10" in err

    summary = run_job(cfg)
    err = capsys.readouterr().err
    assert err.count("warning: data.limit") == 1  # printed by preflight, not again by explain
    assert summary["warnings"][0].startswith("data.limit keeps the first 10 of 40 questions")
    on_disk = json.loads((cfg.run_dir / "summary.json").read_text())
    assert on_disk["warnings"][0] == summary["warnings"][0]
    assert "data.limit keeps the first 10" in (cfg.run_dir / "report" / "index.html").read_text()


def test_a_sample_is_not_warned(tmp_path, tiny_bert_dir, capsys):
    data = _squad(tmp_path / "squad.json")
    preflight(_job(tmp_path, tiny_bert_dir, data, sample=10))
    assert "warning" not in capsys.readouterr().err

from helpers import make_job

from rapids_attn.jobfile import load_job
from rapids_attn.pipeline import run_job


def test_tiny_models_run_a_job(tmp_path, tiny_bert_dir, tiny_gpt2_dir, tiny_llama_dir, pair_data):
    for d in (tiny_bert_dir, tiny_gpt2_dir, tiny_llama_dir):
        cfg = load_job(None, raw=make_job(tmp_path / d.name, d, pair_data))
        s = run_job(cfg)
        assert s["counts"]["maps"] == 20 * 2 * 2

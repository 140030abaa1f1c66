"""Text pairs carry segment ids into the model (BERT-style token_type_ids)."""

import numpy as np
import torch
from helpers import make_job

from rapids_attn.data import Example
from rapids_attn.extract.batching import tokenize
from rapids_attn.extract.model import load_tokenizer
from rapids_attn.extract.shard import Extractor, ShardTask
from rapids_attn.jobfile import load_job
from rapids_attn.pipeline import preflight


def test_pairs_have_segment_ids_and_the_model_sees_them(tmp_path, tiny_bert_dir, pair_data):
    raw = make_job(tmp_path, tiny_bert_dir, pair_data)
    cfg = load_job(None, raw=raw)
    ctx = preflight(cfg, ("extract",)).ctx
    tok = load_tokenizer(cfg.model)
    t = tokenize(tok, [Example("a", "what is it?", "it is a test of segments.")], 64)
    types = t.token_type_ids[0]
    sep = t.input_ids[0].index(tok.sep_token_id)
    assert types[: sep + 1] == [0] * (sep + 1) and set(types[sep + 1 :]) == {1}
    assert t.batch([0]) == {"input_ids": t.input_ids, "token_type_ids": t.token_type_ids}

    ex = Extractor(ShardTask.from_job(cfg, ctx.layout, ctx.model.max_length))
    with_types = ex.run_batch(**t.batch([0]))["stats"].numpy()
    without = ex.run_batch(t.input_ids)["stats"].numpy()
    assert not np.allclose(with_types, without)  # the segment embedding changes the maps: it must be passed
    assert torch.is_tensor(ex.run_batch(**t.batch([0]))["images"])

"""Library code leaves the process as it found it: loggers, progress bars, warning filters and
PyTorch's quantized engine are set by the CLI only (rapids_attn.run.configure_process)."""

import logging
import warnings

import torch

from rapids_attn.data import Example
from rapids_attn.extract.batching import tokenize
from rapids_attn.extract.model import load_model, load_tokenizer
from rapids_attn.job import ModelConfig


def _state():
    from transformers.utils import logging as hf_logging

    return {
        "loggers": {
            name: logging.getLogger(name).level
            for name in ("transformers", "transformers.tokenization_utils_base", "distributed")
        },
        "hf_progress": hf_logging.is_progress_bar_enabled(),
        "warning_filters": list(warnings.filters),
        "quantized_engine": torch.backends.quantized.engine,
    }


def test_model_tokenizer_and_int8_leave_process_state_alone(tiny_bert_dir):
    from rapids_attn.embed.backbone import BackboneEmbedder

    before = _state()
    cfg = ModelConfig(name=str(tiny_bert_dir))
    tok = load_tokenizer(cfg)
    long = Example("x", "word " * 400)  # longer than the model's 128 positions: truncated, no notice
    out = tokenize(tok, [long], 64)
    assert out.truncated == [True] and len(out.input_ids[0]) == 64
    load_model(cfg, "cpu", "float32")
    emb = BackboneEmbedder("resnet18", "random", input_size=32, batch_size=8, precision="int8", image_size=16)
    emb(torch.rand(2, 16, 16))
    assert _state() == before


def test_cli_sets_process_state_once(monkeypatch):
    import os

    from rapids_attn.run import configure_process

    for var in ("OMP_WAIT_POLICY", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(var, raising=False)
    configure_process(verbose=False)
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert logging.getLogger("distributed").level == logging.CRITICAL

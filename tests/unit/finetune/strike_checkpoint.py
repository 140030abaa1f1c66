"""Run by test_checkpoints.py in a process of its own: a tiny QA fine-tune (test_qa's model, examples and
settings: 6 steps, a checkpoint every 2) that kill -9s itself at POINT of writing checkpoint-4.

    python strike_checkpoint.py WORK POINT

POINT: before (the step is done, nothing of checkpoint-4 written), config (config.json written, no weights),
weights (half of model.safetensors written), optimizer (half of optimizer.pt), state (every file but half of
trainer_state.json, which Trainer writes last), after (checkpoint-4 whole)."""

import dataclasses
import json
import os
import signal
import sys
from pathlib import Path

import torch
from test_qa import SETTINGS, _examples, _model
from transformers import AutoTokenizer, TrainerCallback

from rapids_attn.extract.model import resolve_model_name
from rapids_attn.finetune.qa import QAWindowing, train_qa

STEP = 4


def die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def ours(path) -> bool:
    return Path(path).parent.name == f"checkpoint-{STEP}"


def half_then_die(path, data: bytes):
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    die()


def main(work: str, point: str):
    import io

    import transformers.modeling_utils as mu
    from transformers.trainer_callback import TrainerState

    if point in ("config", "weights"):
        real = mu.safe_save_file

        def save_file(tensors, filename, metadata=None):
            if ours(filename):
                if point == "config":
                    die()
                from safetensors.torch import save

                half_then_die(filename, save(tensors, metadata=metadata))
            return real(tensors, filename, metadata=metadata)

        mu.safe_save_file = save_file
    if point == "optimizer":
        real_save = torch.save

        def save(obj, f, *a, **k):
            if isinstance(f, (str, os.PathLike)) and ours(f) and Path(f).name == "optimizer.pt":
                buf = io.BytesIO()
                real_save(obj, buf, *a, **k)
                half_then_die(f, buf.getvalue())
            return real_save(obj, f, *a, **k)

        torch.save = save
    if point == "state":
        real_json = TrainerState.save_to_json

        def save_to_json(self, json_path):
            if ours(json_path):
                half_then_die(json_path, json.dumps(dataclasses.asdict(self), indent=2).encode())
            return real_json(self, json_path)

        TrainerState.save_to_json = save_to_json

    class Strike(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if point == "before" and state.global_step == STEP:
                die()

        def on_save(self, args, state, control, **kwargs):
            if point == "after" and state.global_step == STEP:
                die()

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_name("minilm-l6"))
    w = QAWindowing(max_length=64, doc_stride=32)
    train_qa(_model(tokenizer), tokenizer, _examples(), w, SETTINGS, Path(work), "cpu", callbacks=[Strike()])
    print("finished without the strike")


if __name__ == "__main__":
    main(*sys.argv[1:])

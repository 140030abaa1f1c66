"""Run by test_checkpoints.py in a process of its own: a tiny QA fine-tune (test_qa's model, examples and
settings: 6 steps, a checkpoint every 2) that kill -9s itself at a POINT of writing checkpoint-4, then reruns.

    python strike_checkpoint.py ROOT POINT [POINT ...]

For each POINT, a child process (forked from this one, which imported torch and ran nothing, so every child
starts alike) trains in ROOT/POINT/work and kill -9s itself at POINT; a second child reruns the same training to
the end there (resuming), its output in ROOT/POINT/rerun.log and its final weights in ROOT/POINT/final.safetensors.
ROOT/whole is one uninterrupted run. ROOT/results.json holds each child's exit status (-9: killed).

POINT: before (the step is done, nothing of checkpoint-4 written), config (config.json written, no weights),
weights (half of model.safetensors written), optimizer (half of optimizer.pt), state (every file but half of
trainer_state.json, which Trainer writes last), after (checkpoint-4 whole)."""

import dataclasses
import json
import os
import signal
import sys
import traceback
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


def main(work: str, point: str, weights: str | None = None):
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
    trainer = train_qa(_model(tokenizer), tokenizer, _examples(), w, SETTINGS, Path(work), "cpu", callbacks=[Strike()])
    if weights:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in trainer.model.state_dict().items()}, weights)
    print(f"finished at step {trainer.state.global_step}")


def child(work: Path, point: str, weights: Path | None, log: Path) -> int:
    """``main`` in a forked child, its output in ``log``: its exit status, or minus the signal that ended it."""
    pid = os.fork()
    if pid == 0:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        code = 0
        try:
            main(str(work), point, str(weights) if weights else None)
        except BaseException:  # noqa: BLE001 - the child reports and exits; the parent reads its status
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def run_all(root: Path, points: list[str]) -> dict:
    results = {}
    whole = root / "whole"
    whole.mkdir(parents=True)
    results["whole"] = {"rerun": child(whole / "work", "none", whole / "final.safetensors", whole / "rerun.log")}
    for point in points:
        here = root / point
        here.mkdir()
        struck = child(here / "work", point, None, here / "strike.log")
        rerun = child(here / "work", "none", here / "final.safetensors", here / "rerun.log")
        results[point] = {"strike": struck, "rerun": rerun}
    (root / "results.json").write_text(json.dumps(results))
    return results


if __name__ == "__main__":
    run_all(Path(sys.argv[1]), sys.argv[2:])

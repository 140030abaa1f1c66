"""A fine-tune killed while it writes a checkpoint resumes (issue 47, item 1): kill -9 at each point of writing
checkpoint-4 (before it, after its config, inside its weights, inside the optimizer's state, inside
trainer_state.json, after it) and the rerun ends with weights bit-identical to an uninterrupted run's; a cut
checkpoint is set aside by name, never deleted, in one line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_qa import SETTINGS, _examples, _model

from rapids_attn.finetune import checkpoints
from rapids_attn.finetune.qa import QAWindowing, train_qa

HERE = Path(__file__).parent
W = QAWindowing(max_length=64, doc_stride=32)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from rapids_attn.extract.model import resolve_model_name

    return AutoTokenizer.from_pretrained(resolve_model_name("minilm-l6"))


@pytest.fixture(scope="module")
def whole(tokenizer, tmp_path_factory):
    return train_qa(_model(tokenizer), tokenizer, _examples(), W, SETTINGS, tmp_path_factory.mktemp("whole"), "cpu")


def strike(work: Path, point: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(  # noqa: PLW1510 - the exit status is what is tested
        [sys.executable, str(HERE / "strike_checkpoint.py"), str(work), point],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


# point, whether checkpoint-4 is left cut, the checkpoint the rerun resumes from
POINTS = [
    ("before", False, "checkpoint-2"),
    ("config", True, "checkpoint-2"),
    ("weights", True, "checkpoint-2"),
    ("optimizer", True, "checkpoint-2"),
    ("state", True, "checkpoint-2"),
    ("after", False, "checkpoint-4"),
]


@pytest.mark.parametrize("point,cut,resumes", POINTS, ids=[p[0] for p in POINTS])
def test_a_kill_at_any_point_of_a_checkpoint_write_resumes_to_identical_weights(
    tmp_path, tokenizer, whole, point, cut, resumes, capsys
):
    work = tmp_path / "work"
    done = strike(work, point)
    assert done.returncode == -9, done.stdout + done.stderr[-3000:]
    names = sorted(p.name for p in work.iterdir() if p.is_dir())
    assert ("checkpoint-4" in names) == (point != "before"), names
    assert (checkpoints.checkpoint_problem(work / "checkpoint-4") is not None) == cut if point != "before" else True

    resumed = train_qa(_model(tokenizer), tokenizer, _examples(), W, SETTINGS, work, "cpu")
    said = [line for line in capsys.readouterr().err.splitlines() if "incomplete" in line]
    if cut:  # set aside by name, kept, said once in one line
        kept = work / "incomplete-checkpoint-4"
        why = checkpoints.checkpoint_problem(kept)
        line = f"rapids_attn: finetune: checkpoint-4 is incomplete ({why}: a run stopped while writing it); "
        assert said == [line + f"set aside as {kept}, resuming from {resumes}"]
        assert (work / "incomplete-checkpoint-4").is_dir()
    else:
        assert said == []
    assert resumed.state.global_step == SETTINGS.max_steps
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def _copy(src: Path, dst: Path, step: int) -> None:
    import json
    import shutil

    shutil.copytree(src, dst)
    state = json.loads((dst / "trainer_state.json").read_text())
    (dst / "trainer_state.json").write_text(json.dumps({**state, "global_step": step}))


def test_every_cut_checkpoint_is_set_aside_and_the_newest_whole_one_resumed(tmp_path, whole):
    """Two cut checkpoints above a whole one; a second cut of a step already set aside keeps both copies; with no
    whole checkpoint training starts over; clearing the work folder keeps what was set aside."""
    src = Path(whole.args.output_dir) / "checkpoint-6"
    work = tmp_path / "work"
    for step in (2, 4, 6):
        _copy(src, work / f"checkpoint-{step}", step)
    (work / "checkpoint-6" / "optimizer.pt").write_bytes(b"\x80")
    (work / "checkpoint-4" / "model.safetensors").unlink()
    said = []
    assert checkpoints.last_complete_checkpoint(work, said.append) == str(work / "checkpoint-2")
    assert [s.split(" is incomplete")[0][-12:] for s in said] == ["checkpoint-6", "checkpoint-4"]
    assert "(optimizer.pt does not load" in said[0] and "(no weights" in said[1]
    assert all(s.endswith("resuming from checkpoint-2") for s in said)
    _copy(src, work / "checkpoint-6", 6)
    (work / "checkpoint-6" / "trainer_state.json").write_text('{"global_step": 5}')
    (work / "checkpoint-2" / "rng_state.pth").unlink()
    said.clear()
    assert checkpoints.last_complete_checkpoint(work, said.append) is None
    assert "trainer_state.json is of step 5" in said[0] and "no rng_state.pth" in said[1]
    assert said[-1].endswith("training from the start")
    kept = [
        "incomplete-checkpoint-2",
        "incomplete-checkpoint-4",
        "incomplete-checkpoint-6",
        "incomplete-checkpoint-6.2",
    ]
    assert sorted(p.name for p in work.iterdir()) == kept
    (work / "made_from.json").write_text("{}")
    checkpoints.clear(work)
    assert sorted(p.name for p in work.iterdir()) == kept

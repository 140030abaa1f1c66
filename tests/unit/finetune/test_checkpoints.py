"""A fine-tune killed while it writes a checkpoint resumes (issue 47, item 1): kill -9 at each point of writing
checkpoint-4 (before it, after its config, inside its weights, inside the optimizer's state, inside
trainer_state.json, after it) and the rerun ends with weights bit-identical to an uninterrupted run's; a cut
checkpoint is set aside by name, never deleted, in one line."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from timebudget import budget

from rapids_attn.finetune import checkpoints

HERE = Path(__file__).parent

# point, whether checkpoint-4 is left cut, the checkpoint the rerun resumes from
POINTS = [
    ("before", False, "checkpoint-2"),
    ("config", True, "checkpoint-2"),
    ("weights", True, "checkpoint-2"),
    ("optimizer", True, "checkpoint-2"),
    ("state", True, "checkpoint-2"),
    ("after", False, "checkpoint-4"),
]


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


@pytest.fixture(scope="module")
@budget(90, "13 tiny fine-tunes in forked processes: a strike and a resume at each of six points, and one whole run")
def struck(tmp_path_factory) -> Path:
    """Every point's strike and rerun, and an uninterrupted run, by one driver process whose forked children all
    start alike (strike_checkpoint.py): torch's threads, and so the order of its sums, are a process's own, and
    the reference and the resumed run must come from the same command, as a rerun after kill -9 does."""
    root = tmp_path_factory.mktemp("struck")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, str(HERE / "strike_checkpoint.py"), str(root), *[p[0] for p in POINTS]],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((root / "results.json").read_text())
    assert results["whole"]["rerun"] == 0, (root / "whole" / "rerun.log").read_text()[-3000:]
    return root


@pytest.mark.parametrize("point,cut,resumes", POINTS, ids=[p[0] for p in POINTS])
def test_a_kill_at_any_point_of_a_checkpoint_write_resumes_to_identical_weights(struck, point, cut, resumes):
    here, work = struck / point, struck / point / "work"
    status = json.loads((struck / "results.json").read_text())[point]
    assert status["strike"] == -signal.SIGKILL, (here / "strike.log").read_text()[-3000:]
    rerun = (here / "rerun.log").read_text()
    assert status["rerun"] == 0 and "finished at step 6" in rerun, rerun[-3000:]
    said = [line for line in rerun.splitlines() if "incomplete" in line]
    if cut:  # set aside by name, kept, said once in one line
        kept = work / "incomplete-checkpoint-4"
        why = checkpoints.checkpoint_problem(kept)
        line = f"rapids_attn: finetune: checkpoint-4 is incomplete ({why}: a run stopped while writing it); "
        assert why is not None and said == [line + f"set aside as {kept}, resuming from {resumes}"]
    else:
        assert said == [] and not (work / "incomplete-checkpoint-4").exists()
    ours, reference = _weights(here / "final.safetensors"), _weights(struck / "whole" / "final.safetensors")
    assert ours.keys() == reference.keys()
    for name, a in reference.items():
        assert torch.equal(a, ours[name]), name


def _copy(src: Path, dst: Path, step: int) -> None:
    import json
    import shutil

    shutil.copytree(src, dst)
    state = json.loads((dst / "trainer_state.json").read_text())
    (dst / "trainer_state.json").write_text(json.dumps({**state, "global_step": step}))


def test_every_cut_checkpoint_is_set_aside_and_the_newest_whole_one_resumed(tmp_path, struck):
    """Two cut checkpoints above a whole one; a second cut of a step already set aside keeps both copies; with no
    whole checkpoint training starts over; clearing the work folder keeps what was set aside."""
    src = struck / "whole" / "work" / "checkpoint-6"
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

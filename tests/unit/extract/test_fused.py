"""The fused capture kernel (rapids_attn/extract/fused.py), run on the CPU by Triton's interpreter
(``TRITON_INTERPRET=1``, set here where no CUDA device is visible), against

- a dense float64 PyTorch reference (tests/fused_reference.py) for each mask the blocked path supports: a 2-D key
  padding mask, a 4-D boolean and a 4-D additive mask, causal, causal with a sliding window, grouped-query heads, a
  subset of heads, attention sinks and soft-capping; in one tile of rows and keys and in several (large tiles keep
  the interpreter fast: its cost grows with programs x loop steps);
- its own precisions (tf32, bf16), each against a reference that rounds its inputs the same way;
- the PyTorch kernel, through the capture, on tiny BERT, GPT-2, Llama, Mistral, Gemma 2 and gpt-oss built here:
  every array the reducer keeps, and the model's output, within 1e-5.
"""

import copy
import os

import pytest
import torch

pytest.importorskip("triton")

from fused_reference import dense
from test_blocked import MODELS, _batch, _gpt_oss

from rapids_attn.errors import ModelError
from rapids_attn.extract import fused
from rapids_attn.extract.blocked import register
from rapids_attn.extract.capture import AttentionCapture
from rapids_attn.extract.fused import PRECISION_RTOL, SUM_NAMES, KernelInputs, MaskSpec, fused_layer
from rapids_attn.extract.kernels import KernelLog, TorchKernel, TritonKernel, resolve_kernel
from rapids_attn.extract.maps import LayerReducer, TokenMasks

DEV = "cuda" if torch.cuda.is_available() else "cpu"
B, H, HK, M, D, S = 2, 4, 2, 40, 16, 8
LENGTHS = torch.tensor([40, 27])


def _inputs(seed: int = 0, B=B, H=H, HK=HK, M=M, D=D, LENGTHS=LENGTHS) -> tuple:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, n, M, D, generator=g) for n in (H, HK, HK))
    ok = (torch.arange(M)[None] < LENGTHS[:, None]).float()
    feat = torch.zeros(B, M, 16)
    feat[:, 0, 0] = 1.0
    feat[:, :, 1] = (torch.rand(B, M, generator=g) < 0.2).float() * ok
    feat[:, :, 2] = (torch.rand(B, M, generator=g) < 0.2).float() * ok
    feat[:, :, 3] = ok
    feat[:, :, 4] = torch.arange(M) * ok
    rt = torch.rand(B, M, 16, generator=g) * ok[..., None]
    rt[..., S:] = 0.0
    rw = torch.zeros(B, M, 8)
    rw[..., 0] = ok
    rw[..., 1] = ok * torch.rand(B, M, generator=g)
    rw[..., 2] = ok * (torch.rand(B, M, generator=g) < 0.5)
    rw[..., 3:6] = (torch.rand(B, M, 3, generator=g) < 0.3).float() * ok[..., None]
    return q, k, v, ok, KernelInputs(feat, rt, rw, S)


def _case(name: str, ok: torch.Tensor):
    """(mask, causal, window, softcap, sinks, kv_heads) of a named case."""
    g = torch.Generator().manual_seed(1)
    pad = ok.bool()
    gqa = torch.tensor([0, 0, 1, 1])
    if name == "padding-2d":
        return pad, False, 0, None, None, gqa
    if name == "padding-4d":  # an encoder's mask as SDPA's mask function gives it: read as [batch, keys]
        return pad[:, None, None, :].expand(B, 1, M, M), False, 0, None, None, gqa
    if name == "bool-4d":  # a prefix-LM-like mask: rows see the real keys up to themselves and the first five
        j, i = torch.arange(M)[None, :], torch.arange(M)[:, None]
        m = ((j <= i) | (j < 5))[None, None] & pad[:, None, None, :]
        return m, True, 0, None, None, gqa
    if name == "additive-4d":  # an eager-style float mask: 0 seen, the dtype's least value hidden, a bias between
        bias = torch.randn(B, 1, M, M, generator=g)
        m = torch.where(pad[:, None, None, :], bias, torch.finfo(torch.float32).min)
        return m, False, 0, None, None, gqa
    if name == "causal":
        return None, True, 0, None, None, gqa
    if name == "causal-4d":  # a decoder's padded batch as SDPA's mask function gives it: key tiles past it skipped
        j, i = torch.arange(M)[None, :], torch.arange(M)[:, None]
        return ((j <= i)[None, None] & pad[:, None, None, :]), True, 0, None, None, gqa
    if name == "causal-window-padding":
        return pad, True, 7, None, None, gqa
    if name == "softcap-sinks":
        return pad, False, 0, 2.0, torch.randn(H, generator=g) * 2.0, gqa
    if name == "head-subset":  # the capture's heads 3 and 0 of a model: key heads 1 and 0
        return pad, True, 0, None, None, torch.tensor([1, 0])
    raise ValueError(name)


CASES = (
    "padding-2d",
    "bool-4d",
    "additive-4d",
    "causal",
    "causal-4d",
    "causal-window-padding",
    "softcap-sinks",
    "head-subset",
)


def _check(name: str, tile: int, precision: str = "ieee", ref_precision: str | None = None, tol: float = 2e-6):
    q, k, v, ok, inputs = _inputs()
    mask, causal, window, softcap, sinks, kv_heads = _case(name, ok)
    if name == "head-subset":
        q = q[:, [3, 0]]
    dev = lambda t: None if t is None else t.to(DEV)
    dev_inputs = KernelInputs(*(dev(t) for t in (inputs.features, inputs.rt, inputs.row_weights)), inputs.size)
    got, out = fused_layer(
        dev(q),
        dev(k),
        dev(v),
        dev(kv_heads),
        MaskSpec(dev(mask), causal, window, 0),
        0.3,
        dev_inputs,
        softcap=softcap,
        sinks=dev(sinks),
        precision=precision,
        block_m=tile,
        block_n=tile,
    )
    sums, img, lse, want_out, _ = dense(
        q, k, v, kv_heads, mask, causal, window, 0, 0.3, inputs, softcap, sinks, ref_precision or precision
    )
    for c, col in enumerate(SUM_NAMES):
        torch.testing.assert_close(
            got.sums[..., c].cpu().double(), sums[..., c], rtol=tol, atol=tol, msg=lambda m, col=col: f"{col}: {m}"
        )
    torch.testing.assert_close(got.image.cpu().double(), img, rtol=tol, atol=tol)
    seen = torch.isfinite(lse)
    torch.testing.assert_close(got.lse.cpu().double()[seen], lse[seen], rtol=1e-6, atol=1e-6)
    assert bool((got.lse.cpu()[~seen] > 1e30).all())  # a row that sees no key: its weights are all 0
    torch.testing.assert_close(out.cpu().double(), want_out, rtol=1e-5, atol=1e-5)
    return got, sums


@pytest.mark.parametrize("name", CASES)
def test_the_kernel_equals_a_dense_reference_in_one_tile(name):
    _check(name, 64)


@pytest.mark.parametrize("name", ["padding-2d", "causal-window-padding", "softcap-sinks", "bool-4d", "causal-4d"])
def test_the_kernel_equals_a_dense_reference_over_several_tiles_of_rows_and_keys(name):
    """Tiles of 16: the online softmax rescales its sums as the row maximum moves across three key tiles, the
    causal and windowed rows skip the tiles they cannot see, and three tiles of rows add up their partial sums."""
    _check(name, 16)


@pytest.mark.parametrize("causal", [False, True])
def test_tiles_beyond_the_recent_band_and_the_sink_tokens_skip_the_band_and_still_count(causal):
    """192 tokens in tiles of 64: a tile of rows meets key tiles more than RECENT_WINDOW (64) away, which skip the
    streaming band's sums (and, causal, key tiles past the diagonal, which are not visited); the sums equal the
    dense reference's all the same."""
    q, k, v, ok, inputs = _inputs(B=1, H=2, HK=1, M=192, D=16, LENGTHS=torch.tensor([180]))
    kv = torch.tensor([0, 0])
    spec = MaskSpec(None if causal else ok.bool(), causal, 0, 0)
    got, out = fused_layer(q, k, v, kv, spec, 0.3, inputs, precision="ieee", block_m=64, block_n=64)
    sums, img, _, want, _ = dense(q, k, v, kv, spec.mask, causal, 0, 0, 0.3, inputs)
    torch.testing.assert_close(got.sums.double(), sums, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(got.image.double(), img, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_each_precision_equals_a_reference_that_rounds_the_same_way_and_stays_within_its_bound(precision):
    """The P @ [F | R^T] product's inputs rounded to TF32 or bfloat16 (on the CPU the kernel rounds them itself, as
    the tensor cores would): the same as a reference that rounds them alike, up to the sums' order; and within the
    precision's bound of the float32 reference (the statistics that go through that product)."""
    # the kernel's weights are float32 exps, the reference's float64 ones rounded: now and then the two round one
    # weight to neighbouring TF32 or bfloat16 values, an error of one ulp on that weight alone (tol), where the
    # precision itself moves the sums by up to its bound (below)
    got, _ = _check("padding-2d", 64, precision, tol=2e-5)
    exact = dense(*_dense_args("padding-2d"), precision="ieee")[0]
    bound = PRECISION_RTOL[precision]
    linear = [SUM_NAMES.index(c) for c in ("first", "sep", "punct", "mass")]
    err = (got.sums.cpu().double()[..., linear] - exact[..., linear]).abs()
    assert bool((err <= bound * exact[..., linear].abs() + 1e-6).all())
    assert float(err.max()) > 1e-7  # the rounding is real: the precision changed the product


def _dense_args(name: str):
    q, k, v, ok, inputs = _inputs()
    mask, causal, window, softcap, sinks, kv_heads = _case(name, ok)
    return q, k, v, kv_heads, mask, causal, window, 0, 0.3, inputs, softcap, sinks


def test_the_launcher_reads_a_4d_mask_for_what_it_is():
    """A causal 4-D mask lets the kernel skip the tiles past the diagonal, a prefix-LM mask does not; an encoder's
    padding mask (every row alike) is read as one row of keys."""
    from rapids_attn.extract.fused import keys_only, upper_hidden

    _, _, _, ok, _ = _inputs()
    memo = {}
    causal = _case("causal-4d", ok)[0]
    assert upper_hidden(causal, 0, memo=memo) and upper_hidden(causal, 0, memo=memo) and len(memo) == 1
    assert not upper_hidden(_case("bool-4d", ok)[0], 0)  # rows see the first five keys, later ones too
    additive = torch.where(causal, 0.0, torch.finfo(torch.float32).min)
    assert upper_hidden(additive, 0) and not upper_hidden(torch.zeros(1, 1, 4, 4), 0)
    assert keys_only(_case("padding-4d", ok)[0], M, M) and not keys_only(causal, M, M)


def test_an_unknown_precision_is_refused():
    q, k, v, _, inputs = _inputs()
    with pytest.raises(ValueError, match="precision"):
        fused_layer(q, k, v, torch.tensor([0, 0, 1, 1]), MaskSpec(None, False, 0, 0), 0.3, inputs, precision="fp8")


def _capture(kind_or_model, lengths, heads=(0, 1, 2, 3), layers=(0, 1)):
    """The reducer's arrays and the output of one batch through the torch kernel and through the triton one."""
    if isinstance(kind_or_model, str):
        cls, cfg = MODELS[kind_or_model]()
        torch.manual_seed(0)
        model = cls._from_config(copy.deepcopy(cfg), attn_implementation=register("capture")).eval()
        causal = kind_or_model not in ("bert", "roberta", "distilbert", "modernbert")
    else:
        model, causal = kind_or_model, True
    model = model.to(DEV)  # on a GPU machine the kernel runs compiled, on CUDA tensors
    batch = {k: v.to(DEV) for k, v in _batch(lengths).items()}
    got = {}
    for kernel in (TorchKernel(), TritonKernel(precision="ieee")):
        masks = TokenMasks.from_ids(
            batch["input_ids"], torch.tensor([5]), torch.tensor([7]), host_ids=batch["input_ids"].cpu()
        )
        red = LayerReducer(lengths, masks, list(layers), list(heads), 8, 4, causal, DEV)
        cap = AttentionCapture(model, 2, kernel=kernel)
        out = cap.run(batch, red).last_hidden_state
        got[kernel.name] = (red, out, cap.kernel_log)
    return got, batch


def _same(got, lengths):
    (ref, ref_out, _), (red, out, log) = got["torch"], got["triton"]
    for name in ("images", "thumbs", "stats", "profile", "detectors"):
        torch.testing.assert_close(getattr(red, name), getattr(ref, name), rtol=1e-5, atol=1e-5, equal_nan=True)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(out[b, :n], ref_out[b, :n], rtol=1e-5, atol=1e-5)
    return log


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama", "mistral"])
def test_the_triton_kernel_gives_every_array_of_the_torch_kernel_through_the_capture(kind):
    """Padding (an encoder's 4-D boolean mask; a decoder's causal one), grouped-query heads (Llama) and a sliding
    window (Mistral): the same images, thumbnails, statistics, profiles and detectors within 1e-5, the same model
    output, and the log says the triton kernel served every layer with no fallback."""
    lengths = [37, 20, 9, 1]
    got, _ = _capture(kind, lengths)
    log = _same(got, lengths)
    assert log.by_kernel() == {"triton": [0, 1]} and not log.fallbacks


def test_attention_sinks_and_a_subset_of_heads_through_the_capture():
    """gpt-oss (attention sinks, a sliding-window layer, grouped-query heads), heads 2 and 0 of layer 1 only: the
    kernel reads the subset's key heads and sinks; the layer's output then comes from the base."""
    cls, cfg = _gpt_oss()
    torch.manual_seed(0)
    model = cls._from_config(copy.deepcopy(cfg), attn_implementation=register("capture")).eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
    lengths = [23, 17, 9]
    got, _ = _capture(model, lengths, heads=(2, 0), layers=(1,))
    log = _same(got, lengths)
    assert log.by_kernel() == {"triton": [1]}


def test_a_sink_that_reads_rows_falls_back_to_the_torch_kernel_and_says_why():
    """The probe's whole-map assembler (as a long input's windows) takes blocks of rows, which the fused kernel never
    makes: the torch kernel serves it, and the log names the reason."""
    cls, cfg = MODELS["bert"]()
    model = cls._from_config(copy.deepcopy(cfg), attn_implementation=register("capture")).eval()
    cap = AttentionCapture(model, 2, kernel=TritonKernel())
    seen = []
    cap.run(_batch([6]), lambda layer, w: seen.append(layer))
    assert seen == [0, 1]
    assert cap.kernel_log.by_kernel() == {"torch": [0, 1]}
    (reason,) = cap.kernel_log.fallbacks
    assert reason.startswith("triton: the sink reads blocks of rows") and cap.kernel_log.fallbacks[reason] == 2


def test_kernel_logs_merge_by_layer_and_reason():
    a, b = KernelLog(), KernelLog()
    a.record(0, "triton")
    b.record(0, "torch", "triton: why")
    b.record(1, "triton")
    a.merge(b)
    assert a.by_kernel() == {"torch": [0], "triton": [0, 1]} and a.fallbacks == {"triton: why": 1}


def test_the_kernel_choice_resolves_per_device_and_refuses_what_cannot_run(monkeypatch):
    assert resolve_kernel("auto", "cpu") == "torch"
    assert resolve_kernel("torch", "cuda") == "torch"
    assert resolve_kernel("auto", "cuda") == "triton"  # Triton is installed here
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_kernel("triton", "cpu") == "triton"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ModelError, match=r"^extract\.kernel: triton runs on a CUDA GPU; on the CPU set TRITON_INTERP"):
        resolve_kernel("triton", "cpu")
    monkeypatch.setattr(fused, "available", lambda: "Triton is not installed")
    assert resolve_kernel("auto", "cuda") == "torch"
    with pytest.raises(ModelError, match=r"^extract\.kernel: triton cannot run here: Triton is not installed"):
        resolve_kernel("triton", "cuda")


def test_a_whole_job_on_the_triton_kernel_stores_what_the_torch_kernel_stores_and_says_so(
    tmp_path, tiny_bert_dir, pair_data
):
    """extract.kernel: triton through the pipeline (in Triton's interpreter here): the store's arrays equal the torch
    kernel's run of the same job within 1e-5 (the same store key: the kernel is not part of it), and summary.json's
    extract run names the kernel of each layer, with no fallback."""
    import numpy as np
    import zarr
    from helpers import make_job

    from rapids_attn.jobfile import load_job
    from rapids_attn.pipeline import run_job

    runs = {}
    for kernel in ("torch", "triton"):
        # float32 and ieee: on a GPU machine (device auto) both kernels then agree within 1e-5 too
        extract = {"kernel": kernel, "kernel_precision": "ieee"}
        raw = make_job(tmp_path / kernel, tiny_bert_dir, pair_data, extract=extract, model={"dtype": "float32"})
        cfg = load_job(None, raw=raw)
        run_job(cfg, ("extract",))
        runs[kernel] = cfg
    a, b = (zarr.open_group(str(runs[k].run_dir / "store.zarr"), mode="r") for k in ("torch", "triton"))
    assert a.attrs["extraction_key"] == b.attrs["extraction_key"]
    for name in ("stats", "detectors"):  # float32
        np.testing.assert_allclose(b[name][:], a[name][:], rtol=1e-5, atol=1e-5, err_msg=name)
    for name in ("features", "profile"):  # float16: the last bit may round the other way
        np.testing.assert_allclose(b[name][:], a[name][:], rtol=2e-3, atol=1e-3, err_msg=name)
    assert np.abs(b["thumbnails"][:].astype(int) - a["thumbnails"][:].astype(int)).max() <= 1  # uint8, rounded
    record = b.attrs["extract_runs"][-1]
    assert record["kernels"] == {"triton": [0, 1]} and record["kernel_fallbacks"] == {}
    assert a.attrs["extract_runs"][-1]["kernels"] == {"torch": [0, 1]}


def test_triton_is_installed_where_the_test_environment_promises_it():
    """The test extra names Triton on Linux (pyproject.toml), so CI runs the kernel's tests rather than skip them."""
    import sys

    if sys.platform.startswith("linux"):
        assert fused.available() is None


def test_the_kernel_benchmark_refuses_a_machine_without_a_gpu(capsys):
    """benchmarks.kernel_ratio's figures (the capture against SDPA) mean nothing in the interpreter: exit 2, one
    line, where no CUDA device is visible."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the benchmark would run")
    from benchmarks.kernel_ratio import main

    assert main(["--cases", "bert-base"]) == 2
    assert capsys.readouterr().err.startswith("error: benchmarks.kernel_ratio measures the capture on a CUDA GPU")


@pytest.mark.slow
def test_the_kernel_compiles_for_hopper_without_a_gpu(tmp_path):
    """Triton compiles for a target it is told (sm_90a: the H100 and H200) with its own ptxas, no GPU needed
    (benchmarks/kernel_registers.py, in a fresh process: this session imported the kernel under the interpreter):
    the kernel's compiled path, which the interpreter never takes (constexpr and runtime branches, dot operand types,
    layouts), builds for the broadest case (a padded causal 4-D mask with its upper triangle skipped, soft-capping,
    attention sinks, float16) with the launch's 8 warps into Hopper's warpgroup products."""
    import json
    import subprocess
    import sys

    from helpers import REPO

    out = tmp_path / "regs.json"
    variant = "padded-causal-softcap-sinks-fp16-d64"
    argv = [
        sys.executable,
        "-m",
        "benchmarks.kernel_registers",
        "--variants",
        variant,
        "--warps",
        "8",
        "--out",
        str(out),
    ]
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    assert row["wgmma"] and 0 < row["registers"] <= 255


def test_a_mask_per_head_with_a_subset_of_the_heads_falls_back():
    """A 4-D mask with a row per head is indexed by the model's head; the kernel numbers the captured heads, so a
    subset of them with such a mask runs the torch kernel (and says why)."""
    from rapids_attn.extract.kernels import LayerAttention
    from rapids_attn.extract.maps import SinkNeeds

    class Sink:
        needs = SinkNeeds(sums=True)

        def __init__(self, heads):
            self.head_list = heads

    q = torch.zeros(1, 2, 4, 8, device=DEV)
    mask = torch.ones(1, 2, 4, 4, dtype=torch.bool, device=DEV)
    layer = LayerAttention(torch.nn.Module(), q, q, None, mask, None, {})
    assert TritonKernel().unsupported(layer, Sink([1])) == "a mask per head with a subset of the heads captured"
    assert TritonKernel().unsupported(layer, Sink(None)) is None
    layer.mask = mask[:, :1]  # one row for every head: the subset reads it as any head would
    assert TritonKernel().unsupported(layer, Sink([1])) is None

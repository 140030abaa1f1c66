"""``python -m benchmarks.kernel_registers [--warps 4 8] [--out FILE]`` (from the repository root; no GPU needed):
the fused capture kernel compiled for Hopper (sm_90a: the H100 and H200) by Triton with its own ptxas, and what
ptxas reports for each variant: registers a thread, spill stores and loads, stack, shared memory, and whether the
products became Hopper's warpgroup instructions (wgmma).

A kernel that spills keeps part of its tiles in local memory (the L1 cache and beyond) instead of registers: on a GPU
that is the first thing to fix before timing it. This is the one figure of the GPU path that a machine without a GPU
can measure exactly (the compiler is deterministic); its speed is ``benchmarks.kernel_ratio``'s, on a GPU.

Run with ``TRITON_INTERPRET`` unset (or 0): under the interpreter the kernel is not a compilable function.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

#: the variants: (name, mask kind, causal, upper triangle hidden, soft-capping, sinks, dtype, precision, head dim)
VARIANTS = {
    "bert-fp16-d64": (2, False, False, False, False, "fp16", 1, 64),  # its padding mask read as [batch, keys]
    "llama-bf16-d128": (0, True, False, False, False, "bf16", 1, 128),
    "padded-causal-softcap-sinks-fp16-d64": (3, True, True, True, True, "fp16", 1, 64),
    "fp32-ieee-additive-d64": (4, False, False, False, False, "fp32", 0, 64),
}


def compile_kernel(variant: str, num_warps: int, block: int = 64):
    """The compiled kernel (triton's CompiledKernel) of ``variant`` for sm_90a."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from rapids_attn.extract.fused import KEY_FEATURES, N_SUMS, ROW_WEIGHTS, pow2
    from rapids_attn.extract.fused_kernel import capture_fwd
    from rapids_attn.extract.signature import PROFILE_OFFSETS, RECENT_WINDOW, SINK_TOKENS

    kind, causal, upper, softcap, sinks, dtype, prec, d = VARIANTS[variant]
    const = {
        "MASK_KIND": kind,
        "CAUSAL": causal,
        "UPPER_HIDDEN": upper,
        "SOFTCAP": softcap,
        "HAS_SINKS": sinks,
        "HAS_OUT": True,
        "PREC": prec,
        "QK_PREC": "ieee" if dtype == "fp32" else "tf32",
        "EMULATE": False,
        "BLOCK_M": block,
        "BLOCK_N": block,
        "BLOCK_D": d,
        "BLOCK_DV": d,
        "BLOCK_S": 32,
        "NF": KEY_FEATURES,
        "NW": ROW_WEIGHTS,
        "NS": N_SUMS,
        "WINDOW_BAND": RECENT_WINDOW,
        "N_SINK": SINK_TOKENS,
        "N_OFF": len(PROFILE_OFFSETS),
        "OFF0": PROFILE_OFFSETS[0],
        "BLOCK_W": pow2(block + len(PROFILE_OFFSETS) - 1),
    }
    pointers = {
        "Q": dtype,
        "K": dtype,
        "V": dtype,
        "Out": dtype,
        "KVH": "i32",
        "Mask": "i8" if kind in (2, 3) else "fp32",
    }
    names = capture_fwd.arg_names
    sig = {}
    for n in names:
        if n in const:
            sig[n] = "constexpr"
        elif n[0].isupper():
            sig[n] = "*" + pointers.get(n, "fp32")
        else:
            sig[n] = "fp32" if n in ("scale", "softcap", "mask_min") else "i32"
    src = ASTSource(capture_fwd, sig, constexprs={(names.index(k),): v for k, v in const.items()})
    return compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def ptxas_report(kernel) -> dict:
    """ptxas -v on the kernel's PTX for sm_90a: registers, spill stores and loads, stack frame (bytes a thread)."""
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(kernel.asm["ptx"])
        r = subprocess.run(
            [str(ptxas), "-v", "--gpu-name", "sm_90a", str(ptx), "-o", os.devnull],
            capture_output=True,
            text=True,
            check=True,
        )
    text = r.stderr

    def num(pattern: str) -> int:
        m = re.search(pattern, text)
        return int(m.group(1)) if m else 0

    return {
        "registers": num(r"Used (\d+) registers"),
        "spill_stores": num(r"(\d+) bytes spill stores"),
        "spill_loads": num(r"(\d+) bytes spill loads"),
        "stack_frame": num(r"(\d+) bytes stack frame"),
        "wgmma_serialized": "wgmma.mma_async instructions are serialized" in text,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    p.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    p.add_argument("--out", type=Path, default=None, help="also write the rows as JSON (the raw results)")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("error: benchmarks.kernel_registers compiles the kernel; unset TRITON_INTERPRET", file=sys.stderr)
        return 2
    rows = []
    print(
        "| variant | warps | registers | spill stores (B) | spill loads (B) | stack (B) | shared (B) | wgmma | serialized |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for v in args.variants:
        for w in args.warps:
            k = compile_kernel(v, w)
            row = {"variant": v, "warps": w, **ptxas_report(k)}
            row["shared"] = int(k.metadata.shared)
            row["wgmma"] = "wgmma" in k.asm["ptx"]
            rows.append(row)
            print(
                f"| {v} | {w} | {row['registers']} | {row['spill_stores']:,} | {row['spill_loads']:,} "
                f"| {row['stack_frame']:,} | {row['shared']:,} | {row['wgmma']} | {row['wgmma_serialized']} |"
            )
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

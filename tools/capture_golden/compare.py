#!/usr/bin/env python
"""Compare two dumps of dump.py:  python tools/capture_golden/compare.py A B [--tol 1e-5] [-q]

A is the reference (today's code), B the candidate. For every case and tensor: max abs diff, and whether the NaN
positions agree. A value fails where it differs by more than ``tol`` absolute AND more than ``tol`` relative (to
max(|a|, |b|)); a tensor fails where its shape differs, its NaN (or +-inf) positions differ, or it is in one dump
only; a case fails where it is missing from B (or A), or raised in either dump (``__errors__``).
Exit 1 listing the offenders, 0 when everything agrees. ``-q``: print the offenders and the summary only.
"""

from __future__ import annotations

import argparse
import sys

import torch

AXES = ("example", "layer", "head")


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def where(idx, shape, name, names) -> str:
    """A flat index as example/layer/head/(stat name | row,col)."""
    coords = []
    for d in reversed(shape):
        coords.append(idx % d)
        idx //= d
    coords = coords[::-1]
    parts = [f"{a}{c}" for a, c in zip(AXES, coords[:3], strict=False)]
    rest = coords[3:]
    label = {"stats": "stats", "detectors": "detectors", "profile": "profile"}.get(name)
    if label and len(rest) == 1 and names and label in names:
        parts.append(names[label][rest[0]])
    elif rest:
        parts.append(",".join(map(str, rest)))
    return " ".join(parts)


def compare_tensor(a: torch.Tensor, b: torch.Tensor, tol: float):
    """(max abs diff, NaN masks agree, inf masks agree, flat indices of failing values worst first, worst rel)."""
    a64, b64 = a.double().reshape(-1), b.double().reshape(-1)
    nan_a, nan_b = torch.isnan(a64), torch.isnan(b64)
    inf_a, inf_b = torch.isinf(a64), torch.isinf(b64)
    nan_ok = bool(torch.equal(nan_a, nan_b))
    inf_ok = bool(torch.equal(inf_a & (a64 > 0), inf_b & (b64 > 0))) and bool(
        torch.equal(inf_a & (a64 < 0), inf_b & (b64 < 0))
    )
    finite = ~(nan_a | nan_b | inf_a | inf_b)
    diff = torch.zeros_like(a64)
    diff[finite] = (a64[finite] - b64[finite]).abs()
    scale = torch.maximum(a64.abs(), b64.abs())
    rel = torch.zeros_like(a64)
    rel[finite] = diff[finite] / scale[finite].clamp_min(1e-300)
    bad = (diff > tol) & (rel > tol)
    bad_idx = torch.nonzero(bad)[:, 0]
    bad_idx = bad_idx[torch.argsort(diff[bad_idx], descending=True)]
    max_diff = float(diff.max()) if diff.numel() else 0.0
    return max_diff, nan_ok, inf_ok, bad_idx, a64, b64, diff


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("a", help="reference dump (today's code)")
    ap.add_argument("b", help="candidate dump")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("-q", "--quiet", action="store_true", help="offenders and summary only")
    args = ap.parse_args()
    A, B = load(args.a), load(args.b)
    names = A.get("__names__") or B.get("__names__")
    offenders: list[str] = []
    for label, d in (("A", A), ("B", B)):
        for case, err in (d.get("__errors__") or {}).items():
            offenders.append(f"{case}: raised in {label}: {err}")
    cases_a = [k for k in A if not k.startswith("__")]
    cases_b = [k for k in B if not k.startswith("__")]
    for case in sorted(set(cases_a) - set(cases_b)):
        offenders.append(f"{case}: missing from B")
    for case in sorted(set(cases_b) - set(cases_a)):
        offenders.append(f"{case}: missing from A")
    n_tensors = n_values = 0
    worst = (0.0, "")
    if not args.quiet:
        print(f"{'case/tensor':60s} {'shape':>22s} {'max|a-b|':>10s}  nan-agree")
    for case in [c for c in cases_a if c in B]:
        ta, tb = A[case], B[case]
        for name in sorted(set(ta) | set(tb)):
            key = f"{case}/{name}"
            if name not in ta or name not in tb:
                offenders.append(f"{key}: in {'A' if name in ta else 'B'} only")
                continue
            a, b = ta[name], tb[name]
            if a.shape != b.shape:
                offenders.append(f"{key}: shape {tuple(a.shape)} vs {tuple(b.shape)}")
                if not args.quiet:
                    print(f"{key:60s} {tuple(a.shape)!s:>22s} {'SHAPE':>10s}")
                continue
            n_tensors += 1
            n_values += a.numel()
            max_diff, nan_ok, inf_ok, bad_idx, a64, b64, _diff = compare_tensor(a, b, args.tol)
            if max_diff > worst[0]:
                worst = (max_diff, key)
            if not args.quiet:
                shape = "x".join(map(str, a.shape))
                print(f"{key:60s} {shape:>22s} {max_diff:10.3g}  {'yes' if nan_ok else 'NO'}")
            if a.dtype != b.dtype:
                print(f"  note: {key}: dtype {a.dtype} vs {b.dtype}")
            if not nan_ok:
                m = torch.nonzero(torch.isnan(a64) != torch.isnan(b64))[:, 0]
                show = "; ".join(
                    f"[{where(int(i), a.shape, name, names)}] {float(a64[i]):.6g} vs {float(b64[i]):.6g}" for i in m[:5]
                )
                offenders.append(f"{key}: NaN positions differ at {len(m)} values, e.g. {show}")
            if not inf_ok:
                offenders.append(f"{key}: inf positions differ")
            if len(bad_idx):
                show = "; ".join(
                    f"[{where(int(i), a.shape, name, names)}] {float(a64[i]):.7g} vs {float(b64[i]):.7g}"
                    for i in bad_idx[:5]
                )
                offenders.append(
                    f"{key}: {len(bad_idx)} of {a.numel()} values off by > {args.tol:g} (abs and rel), "
                    f"max {max_diff:.3g}: {show}"
                )
    if offenders:
        print(f"\nFAILED: {len(offenders)} offenders:")
        for o in offenders:
            print("  " + o)
    status = "FAIL" if offenders else "OK"
    print(
        f"\n{status}: {len(set(cases_a) & set(cases_b))} common cases ({len(cases_a)} in A, {len(cases_b)} in B), "
        f"{n_tensors} tensors, {n_values} values; max abs diff {worst[0]:.3g}"
        + (f" ({worst[1]})" if worst[1] else "")
        + f"; {len(offenders)} offenders (tol {args.tol:g} abs and rel)"
    )
    return 1 if offenders else 0


if __name__ == "__main__":
    sys.exit(main())

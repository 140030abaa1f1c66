"""The fused capture's Triton kernel (documented in :mod:`rapids_attn.extract.fused`, which launches it).

Imported only when the kernel is first launched: Triton reads ``TRITON_INTERPRET`` when the kernel is decorated,
so the first import decides, for the whole process, whether it runs on the device or in Triton's interpreter (on
CPU tensors). :func:`rapids_attn.extract.fused.fused_layer` refuses tensors the kernel cannot run on.
"""

import triton
import triton.language as tl


@triton.jit
def _hidden(
    Mask,
    b,
    h,
    i,
    j,
    q_len,
    n_keys,
    past,
    window,
    sm_b,
    sm_h,
    sm_m,
    sm_n,
    mask_min,
    MASK_KIND: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    """Whether query row i (0-based in the queries) cannot see key j, and the additive mask's value there;
    ``i`` and ``j`` broadcast against each other ([M, 1] and [1, N], or [M] and [M])."""
    hide = (j >= n_keys) | (j < 0)
    add = tl.zeros(hide.shape, dtype=tl.float32)
    if MASK_KIND == 3 or MASK_KIND == 4:  # 4-D, boolean (3) or additive (4): the mask alone decides
        ok = (j >= 0) & (j < n_keys) & (i < q_len)  # a tile's rows past the queries read nothing
        jj = tl.where(ok, j, 0)
        ii = tl.where(ok, i, 0)
        m = tl.load(Mask + b * sm_b + h * sm_h + ii * sm_m + jj * sm_n, mask=ok, other=0)
        if MASK_KIND == 3:
            hide = hide | (m == 0)
        else:
            m = m.to(tl.float32)
            hide = hide | (m <= mask_min)
            add = tl.where(hide, 0.0, m)
    else:
        if CAUSAL:
            ia = i + past
            hide = hide | (j > ia)
            if window > 0:
                hide = hide | (j <= ia - window)
        if MASK_KIND == 2:  # a 2-D key padding mask [batch, keys], nonzero = a real token
            ok = (j >= 0) & (j < n_keys)
            jj = tl.where(ok, j, 0)
            m = tl.load(Mask + b * sm_b + jj * sm_n, mask=ok, other=0)
            hide = hide | (m == 0)
    return hide, add


@triton.jit
def _scores(qk, add, hide, softcap, SOFTCAP: tl.constexpr):
    s = qk
    if SOFTCAP:  # tanh(s / cap) * cap, tanh from exp (the interpreter has no tanh)
        t = tl.exp(-2.0 * tl.abs(s / softcap))
        th = (1.0 - t) / (1.0 + t)
        s = tl.where(s < 0, -th, th) * softcap
    s = s + add
    return tl.where(hide, -1.0e30, s)


@triton.jit
def _tf32(x):
    """x rounded to TF32 as the tensor cores round it (10-bit mantissa, to nearest, ties away from zero)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x1000) & 0xFFFFE000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _bf16(x):
    """x rounded to bfloat16 and back (8-bit mantissa, to nearest even), as ``x.to(tl.bfloat16)`` on a GPU: the
    interpreter's own conversion truncates."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _features_dot(p, f, PREC: tl.constexpr, EMULATE: tl.constexpr):
    """p @ f in the chosen input precision, accumulated in float32. Triton's interpreter computes every dot in
    float32 (and reads bfloat16 operands as their bits): with EMULATE the inputs are rounded here as the
    tensor cores would round them, so the interpreter gives what a GPU would, up to the sums' order."""
    if PREC == 2:
        if EMULATE:
            r = tl.dot(_bf16(p), _bf16(f), input_precision="ieee")
        else:
            r = tl.dot(p.to(tl.bfloat16), f.to(tl.bfloat16))
    elif PREC == 1:
        if EMULATE:
            r = tl.dot(_tf32(p), _tf32(f), input_precision="ieee")
        else:
            r = tl.dot(p, f, input_precision="tf32")
    else:
        r = tl.dot(p, f, input_precision="ieee")
    return r


@triton.jit
def capture_fwd(
    Q,
    K,
    V,
    KVH,
    Sinks,
    Mask,
    FK,
    RT,
    RW,
    Out,
    Lse,
    Sums,
    Img,
    n_heads,
    q_len,
    n_keys,
    past,
    window,
    scale,
    softcap,
    mask_min,
    head_dim,
    v_dim,
    sq_b,
    sq_h,
    sq_m,
    sk_b,
    sk_h,
    sk_n,
    sv_b,
    sv_h,
    sv_n,
    so_b,
    so_m,
    so_h,
    sm_b,
    sm_h,
    sm_m,
    sm_n,
    n_row_tiles,
    img_size,
    MASK_KIND: tl.constexpr,
    CAUSAL: tl.constexpr,
    UPPER_HIDDEN: tl.constexpr,
    SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_OUT: tl.constexpr,
    PREC: tl.constexpr,
    QK_PREC: tl.constexpr,
    EMULATE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_S: tl.constexpr,
    NF: tl.constexpr,
    NW: tl.constexpr,
    NS: tl.constexpr,
    WINDOW_BAND: tl.constexpr,
    N_SINK: tl.constexpr,
    N_OFF: tl.constexpr,
    OFF0: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    kvh = tl.load(KVH + h)
    start_m = tile * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_f = tl.arange(0, NF)
    offs_s = tl.arange(0, BLOCK_S)
    row_in = offs_m < q_len
    q = tl.load(
        Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_m + offs_d[None, :],
        mask=row_in[:, None] & (offs_d[None, :] < head_dim),
        other=0.0,
    )
    if EMULATE:  # the interpreter multiplies half-precision operands as float32 (exact products either way)
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # running maximum of the scores
    mk_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # of the keys' scores alone (sinks aside)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    ps_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # sum exp(s - m) s
    dist_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # sum exp(s - m) |i - j|
    band_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # sum exp(s - m) on the recent band and the sink tokens
    acc_f = tl.zeros([BLOCK_M, NF], dtype=tl.float32)
    acc_r = tl.zeros([BLOCK_M, BLOCK_S], dtype=tl.float32)
    acc_o = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    lo = n_keys * 0
    hi = n_keys + 0
    # causal: keys past the tile's last row are hidden, and, without a 4-D mask, so are those before its first
    # row's window. A 4-D mask alone decides what a row sees; its key tiles past the diagonal are skipped only where
    # the launcher found it hides every key past each row (UPPER_HIDDEN: not a prefix-LM mask)
    if CAUSAL and ((MASK_KIND != 3 and MASK_KIND != 4) or UPPER_HIDDEN):
        hi = tl.minimum(n_keys, start_m + BLOCK_M + past)
    if CAUSAL and MASK_KIND != 3 and MASK_KIND != 4 and window > 0:
        lo = tl.maximum(0, start_m + past - window + 1)
        lo = (lo // BLOCK_N) * BLOCK_N
    row_pos = (offs_m + past).to(tl.float32)  # each row's position among the keys
    band_lo = start_m + past - WINDOW_BAND  # the keys any row of the tile has within its recent band
    band_hi = start_m + past + BLOCK_M + WINDOW_BAND
    k_base = K + b * sk_b + kvh * sk_h
    v_base = V + b * sv_b + kvh * sv_h
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_in = offs_n < n_keys
        k = tl.load(
            k_base + offs_n[None, :] * sk_n + offs_d[:, None],
            mask=key_in[None, :] & (offs_d[:, None] < head_dim),
            other=0.0,
        )
        if EMULATE:
            k = k.to(tl.float32)
        qk = tl.dot(q, k, input_precision=QK_PREC) * scale
        hide, add = _hidden(
            Mask,
            b,
            h,
            offs_m[:, None],
            offs_n[None, :],
            q_len,
            n_keys,
            past,
            window,
            sm_b,
            sm_h,
            sm_m,
            sm_n,
            mask_min,
            MASK_KIND,
            CAUSAL,
        )
        s = _scores(qk, add, hide, softcap, SOFTCAP)
        mk_new = tl.maximum(mk_i, tl.max(s, 1))
        m_new = tl.maximum(m_i, mk_new)
        alpha = tl.exp(m_i - m_new)
        p = tl.where(hide, 0.0, tl.exp(s - m_new[:, None]))
        # |i - j| in floats from two vectors (no integer conversion per element); a hidden key's p is 0 and its
        # score finite (-1e30), so p * s needs no select
        dd = tl.abs(offs_n.to(tl.float32)[None, :] - row_pos[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        ps_i = ps_i * alpha + tl.sum(p * s, 1)
        dist_i = dist_i * alpha + tl.sum(p * dd, 1)
        # the recent band and the sink tokens: only tiles that reach them (most of a long input's tiles do not)
        if (start_n < N_SINK) | ((start_n < band_hi) & (start_n + BLOCK_N > band_lo)):
            near = (dd < WINDOW_BAND) | (offs_n[None, :] < N_SINK)
            band_i = band_i * alpha + tl.sum(tl.where(near, p, 0.0), 1)
        else:
            band_i = band_i * alpha
        fk = tl.load(FK + b * n_keys * NF + offs_n[:, None] * NF + offs_f[None, :], mask=key_in[:, None], other=0.0)
        rt = tl.load(
            RT + b * n_keys * BLOCK_S + offs_n[:, None] * BLOCK_S + offs_s[None, :],
            mask=key_in[:, None],
            other=0.0,
        )
        acc_f = acc_f * alpha[:, None] + _features_dot(p, fk, PREC, EMULATE)
        acc_r = acc_r * alpha[:, None] + _features_dot(p, rt, PREC, EMULATE)
        if HAS_OUT:
            v = tl.load(
                v_base + offs_n[:, None] * sv_n + offs_dv[None, :],
                mask=key_in[:, None] & (offs_dv[None, :] < v_dim),
                other=0.0,
            )
            if EMULATE:  # p rounded to the values' dtype, as on a GPU, then multiplied as float32
                pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v, input_precision=QK_PREC)
            acc_o = acc_o * alpha[:, None] + pv
        m_i = m_new
        mk_i = mk_new
    l_keys = l_i
    if HAS_SINKS:  # the sink logit is one more term of the denominator
        sk = tl.load(Sinks + h).to(tl.float32)
        m_fin = tl.maximum(m_i, sk)
        rescale = tl.exp(m_i - m_fin)
        l_keys = l_i * rescale
        l_all = l_keys + tl.exp(sk - m_fin)
        ps_i = ps_i * rescale
        dist_i = dist_i * rescale
        band_i = band_i * rescale
        acc_f = acc_f * rescale[:, None]
        acc_r = acc_r * rescale[:, None]
        acc_o = acc_o * rescale[:, None]
        m_i = m_fin
    else:
        l_all = l_i
    seen_any = l_keys > 0.0  # a row that sees no key (padding under a 4-D mask) weighs nothing
    inv = tl.where(seen_any, 1.0 / tl.where(seen_any, l_all, 1.0), 0.0)
    lse = m_i + tl.log(tl.where(seen_any, l_all, 1.0))
    tl.store(Lse + bh * q_len + offs_m, tl.where(seen_any, lse, 3.0e38), mask=row_in)
    if HAS_OUT:
        o = acc_o * inv[:, None]
        tl.store(
            Out + b * so_b + h * so_h + offs_m[:, None] * so_m + offs_dv[None, :],
            o.to(Out.dtype.element_ty),
            mask=row_in[:, None] & (offs_dv[None, :] < v_dim),
        )
    # the rows' weights: a real row, 1 / log(keys seen), beyond the streaming set, three repeat targets
    rw_base = RW + b * q_len * NW + offs_m * NW
    w_ok = tl.load(rw_base + 0, mask=row_in, other=0.0)
    w_log = tl.load(rw_base + 1, mask=row_in, other=0.0)
    w_beyond = tl.load(rw_base + 2, mask=row_in, other=0.0)
    mass = l_keys * inv  # sum of the keys' weights (1 without a sink)
    entropy = tl.where(seen_any, lse * mass - ps_i * inv, 0.0)
    row_max = tl.where(seen_any, tl.exp(mk_i - lse), 0.0)
    f = acc_f * inv[:, None]
    base = Sums + (bh * n_row_tiles + tile) * NS
    for c in tl.static_range(4):  # first, sep, punct, mass: the first four key features
        col = tl.sum(tl.where(offs_f[None, :] == c, f, 0.0), 1)
        tl.store(base + c, tl.sum(w_ok * col, 0))
    tl.store(base + 4, tl.sum(w_ok * entropy, 0))
    tl.store(base + 5, tl.sum(w_log * entropy, 0))
    tl.store(base + 6, tl.sum(w_ok * row_max, 0))
    tl.store(base + 7, tl.sum(w_ok * dist_i * inv, 0))
    tl.store(base + 8, tl.sum(w_beyond * band_i * inv, 0))
    for t in tl.static_range(3):
        w_t = tl.load(rw_base + 3 + t, mask=row_in, other=0.0)
        tl.store(base + 9 + N_OFF + t, tl.sum(w_t * mass, 0))
    # the profile's diagonals p(i, i + o): the tile's rows scored again against the keys around them (one product,
    # [rows, BLOCK_W] with BLOCK_W >= rows + N_OFF - 1, in the main loop's precision), over the final log-sum-exp
    offs_w = start_m + past + OFF0 + tl.arange(0, BLOCK_W)
    in_w = (offs_w >= 0) & (offs_w < n_keys)
    kw = tl.load(
        k_base + tl.where(in_w, offs_w, 0)[None, :] * sk_n + offs_d[:, None],
        mask=in_w[None, :] & (offs_d[:, None] < head_dim),
        other=0.0,
    )
    if EMULATE:
        kw = kw.to(tl.float32)
    qk_w = tl.dot(q, kw, input_precision=QK_PREC) * scale
    hide_w, add_w = _hidden(
        Mask,
        b,
        h,
        offs_m[:, None],
        offs_w[None, :],
        q_len,
        n_keys,
        past,
        window,
        sm_b,
        sm_h,
        sm_m,
        sm_n,
        mask_min,
        MASK_KIND,
        CAUSAL,
    )
    s_w = _scores(qk_w, add_w, hide_w, softcap, SOFTCAP)
    p_w = tl.where(hide_w | ~seen_any[:, None], 0.0, tl.exp(s_w - lse[:, None]))
    rel = offs_w[None, :] - (offs_m[:, None] + past + OFF0)  # the offset's index, 0 .. N_OFF - 1, on the band
    for o in tl.static_range(N_OFF):
        tl.store(base + 9 + o, tl.sum(w_ok * tl.sum(tl.where(rel == o, p_w, 0.0), 1), 0))
    # the image's rows: R[:, rows] @ (P R^T), the rows weighted by w_ok (0 past an example's length)
    rt_rows = tl.load(
        RT + b * n_keys * BLOCK_S + offs_m[:, None] * BLOCK_S + offs_s[None, :],
        mask=row_in[:, None] & (offs_m[:, None] < n_keys),
        other=0.0,
    )
    r = acc_r * (inv * w_ok)[:, None]
    img = tl.dot(tl.trans(rt_rows), r, input_precision="ieee")
    tl.store(
        Img + (bh * n_row_tiles + tile) * BLOCK_S * BLOCK_S + offs_s[:, None] * BLOCK_S + offs_s[None, :],
        img,
        mask=(offs_s[:, None] < img_size) & (offs_s[None, :] < img_size),
    )

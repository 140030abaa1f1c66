"""How a long input is cut into windows (rapids_attn/extract/windows.py): every position is owned by exactly one
window, windows hold the input's special tokens and at most max_length tokens, consecutive windows share the
overlap, and ownership puts each owned row away from a window's cut edge."""

from __future__ import annotations

import pytest

from rapids_attn.extract.windows import plan_windows, special_ends

CLS, SEP = 101, 102


def _ids(content: int, specials: bool = True) -> list[int]:
    body = [1000 + i for i in range(content)]
    return [CLS, *body, SEP] if specials else body


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("content", "width", "overlap"), [(50, 16, 4), (14, 16, 4), (15, 16, 0), (97, 24, 10), (30, 8, 5)]
)
def test_windows_tile_the_input(causal, content, width, overlap):
    ids = _ids(content)
    plan = plan_windows(ids, None, width, overlap, (1, 1), causal)
    owners = [0] * len(ids)
    for w, wids in zip(plan.windows, plan.input_ids, strict=True):
        assert len(wids) <= width
        assert wids[0] == CLS and wids[-1] == SEP
        assert wids == [ids[p] for p in w.positions.tolist()]
        for r in w.owned.tolist():
            owners[w.positions[r]] += 1
    assert owners == [1] * len(ids)
    starts = [int(w.positions[1]) for w in plan.windows]
    ends = [int(w.positions[-2]) for w in plan.windows]
    for k in range(len(plan.windows) - 1):  # consecutive windows share at least the overlap
        assert ends[k] - starts[k + 1] + 1 >= overlap


def test_owned_rows_keep_context_from_the_cut():
    ids = _ids(100)
    width, overlap = 22, 10  # 20 content tokens, stride 10
    for causal in (False, True):
        plan = plan_windows(ids, None, width, overlap, (1, 1), causal)
        for k, w in enumerate(plan.windows):
            content_rows = [r for r in w.owned.tolist() if 0 < r < len(w.positions) - 1]
            if k > 0:  # rows after a cut: overlap (causal) or half of it (bidirectional) tokens of context before
                assert min(content_rows) - 1 >= (overlap if causal else overlap // 2)
            if k < len(plan.windows) - 1 and not causal:
                assert len(w.positions) - 2 - max(content_rows) >= overlap // 2


def test_a_decoder_input_without_special_tokens():
    ids = _ids(40, specials=False)
    plan = plan_windows(ids, [0] * 40, 16, 6, (0, 0), True)
    assert special_ends(ids, {CLS, SEP}) == (0, 0)
    assert sorted(p for w in plan.windows for p in w.positions[w.owned].tolist()) == list(range(40))
    assert plan.token_type_ids is not None and all(
        len(t) == len(i) for t, i in zip(plan.token_type_ids, plan.input_ids, strict=True)
    )


def test_an_overlap_that_leaves_no_stride_is_refused():
    with pytest.raises(ValueError, match="window_overlap: 14 must be less than the 14 content tokens"):
        plan_windows(_ids(50), None, 16, 14, (1, 1), False)

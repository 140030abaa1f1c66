"""Pattern labels that never contradict the statistics: the defining rules, `other`, the temperature."""

import json

import pytest
import torch

from rapids_attn.extract.maps import PROFILE_OFFSETS, STAT_NAMES
from rapids_attn.patterns.generator import PATTERN_TYPES, featurize, sample_map
from rapids_attn.patterns.rules import LABELS, OTHER, OTHER_INDEX, agrees, label, rule_table

S = {n: i for i, n in enumerate(STAT_NAMES)}
T = {t: i for i, t in enumerate(PATTERN_TYPES)}


def _pure(t: str, causal: bool, n: int | None = None, count: int = 20):
    return featurize([sample_map(11, i, dominant=t, causal=causal, n=n, pure=True) for i in range(count)])


@pytest.mark.parametrize("t", PATTERN_TYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_each_rule_accepts_its_pure_generated_type(t, causal):
    if t == "next" and causal:
        pytest.skip("a causal map has no next type")
    # the diffuse types at a realistic length: an 8-token block or causal row 1 is one-position by construction
    n = 128 if t in ("block", "broad", "hetero") else None
    _, profile, stats, _ = _pure(t, causal, n)
    assert rule_table(stats, profile)[:, T[t]].all()


def _stats(**values) -> torch.Tensor:
    """One map's stats: a diffuse map (entropy_norm 0.8, small masses) with ``values`` set."""
    s = torch.zeros(1, len(STAT_NAMES))
    s[0, S["entropy_norm"]] = 0.8
    s[0, S["first"]] = 0.05
    s[0, S["sep"]] = 0.01
    s[0, S["punct"]] = 0.1
    s[0, S["max"]] = 0.1
    for k, v in values.items():
        s[0, S[k]] = v
    return s


def _confident(t: str) -> torch.Tensor:
    logits = torch.zeros(1, len(PATTERN_TYPES))
    logits[0, T[t]] = 10.0
    return logits


FLAT = torch.full((1, len(PROFILE_OFFSETS)), 0.01)


@pytest.mark.parametrize(
    "t, contradicting",
    [
        ("sep", {}),  # named sep with [SEP] mass 0.01
        ("punct", {}),  # punctuation mass 0.1: what a uniform row gives
        ("first", {"first": 0.2}),
        ("prev", {"prev": 0.3, "self": 0.4}),  # prev is not the largest offset
        ("broad", {"first": 0.35}),  # over 0.30 on [CLS] is not broad
        ("broad", {"next": 0.45}),
        ("hetero", {"sep": 0.6}),
        ("band", {}),  # no mass near the diagonal
    ],
)
def test_a_confident_type_that_contradicts_its_statistic_becomes_other(t, contradicting):
    stats = _stats(**contradicting)
    pattern, prob = label(_confident(t), stats, FLAT)
    assert LABELS[int(pattern[0])] == OTHER and float(prob[0]) > 0.99
    assert bool(agrees(pattern, stats, FLAT)[0])  # other claims nothing
    assert not bool(agrees(torch.tensor([T[t]]), stats, FLAT)[0])


def test_agreeing_type_is_kept_and_improbable_one_is_not():
    stats = _stats(sep=0.6)
    pattern, _ = label(_confident("sep"), stats, FLAT)
    assert LABELS[int(pattern[0])] == "sep"
    unsure = torch.zeros(1, len(PATTERN_TYPES))
    unsure[0, T["sep"]] = 0.5  # the top type, at probability ~0.15
    pattern, prob = label(unsure, stats, FLAT)
    assert int(pattern[0]) == OTHER_INDEX and float(prob[0]) < 0.5
    # undefined (NaN) statistics satisfy no rule
    nan = _stats(sep=float("nan"))
    assert int(label(_confident("sep"), nan, FLAT)[0][0]) == OTHER_INDEX


def test_the_embedder_applies_the_shipped_temperature_and_records_other():
    from rapids_attn.embed.pattern import PatternCNNEmbedder
    from rapids_attn.patterns.cnn import META_FILE

    meta = json.loads(META_FILE.read_text())
    t = meta["temperature"]
    assert 0.1 < t < 10 and t != 1.0
    assert meta["calibration"]["ece_after"] < meta["calibration"]["ece_before"]
    assert meta["calibration"]["fit_seed"] not in (meta["training"]["seed"], meta["heldout"]["seed"])
    emb = PatternCNNEmbedder("cpu")
    assert emb.temperature == t
    assert emb.classes == LABELS and emb.store_attrs["pattern_classes"][-1] == OTHER
    assert emb.store_attrs["pattern_labelling"]["temperature"] == t
    images, profile, stats, _ = featurize([sample_map(5, i) for i in range(30)])
    _, extras = emb.embed(images, profile, stats)
    with torch.inference_mode():
        logits = emb.model(images, profile, stats)
    expected = torch.softmax(logits / t, 1).max(1).values
    torch.testing.assert_close(extras["pattern_prob"], expected, atol=1e-5, rtol=1e-4)
    named = extras["pattern"] != OTHER_INDEX
    assert named.any()
    assert torch.equal(extras["pattern"][named], logits.argmax(1)[named])
    assert agrees(extras["pattern"], stats, profile).all()

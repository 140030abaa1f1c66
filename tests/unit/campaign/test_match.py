"""Cross-model head matching (issue 50) from what runs stored: synthetic profiles, then MiniLM against a copy of
itself whose heads were permuted within each layer (query, key, value and output weights together: the same
function), which the matching must map back to exactly that permutation."""

import json

import numpy as np
import pytest
import zarr
from helpers import make_job

from rapids_attn.campaign.match import (
    HeadProfiles,
    head_profiles,
    layer_similarity,
    match_heads,
    match_within_layers,
)


def _profiles(features: np.ndarray) -> HeadProfiles:
    nl, nh, nf = features.shape
    return HeadProfiles(list(range(nl)), list(range(nh)), [f"f{i}" for i in range(nf)], features)


def test_a_permuted_copy_is_matched_back_and_a_model_to_itself_is_the_identity():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(3, 6, 10))
    perms = np.array([rng.permutation(6) for _ in range(3)])
    b = np.stack([a[i, perms[i]] for i in range(3)])  # b's head j is a's head perm[j]
    b[1, 2, 4] = np.nan  # an undefined feature adds nothing
    m = match_within_layers(_profiles(a), _profiles(b))
    inverse = np.argsort(perms, axis=1)  # a's head h is b's head inverse[h]
    np.testing.assert_array_equal(m.match, inverse)
    assert (m.margin > 0).all()
    same = match_within_layers(_profiles(a), _profiles(a))
    np.testing.assert_array_equal(same.match, np.tile(np.arange(6), (3, 1)))
    assert np.allclose(same.distance, 0, atol=1e-6)
    pairs = match_heads(_profiles(a), _profiles(a)).pairs
    assert all(x == y for x, y, _ in pairs) and len(pairs) == 18


def test_models_of_different_shapes_are_matched_with_depth_in_the_cost():
    rng = np.random.default_rng(1)
    small = rng.normal(size=(2, 3, 8))
    # the big model holds the small one's heads, at the same relative depth (layers 0 and 3 of 4), among others
    big = rng.normal(size=(4, 5, 8)) * 3 + 10
    big[0, [4, 0, 2]] = small[0]
    big[3, [1, 3, 0]] = small[1]
    pairs = {x: y for x, y, _ in match_heads(_profiles(small), _profiles(big)).pairs}
    assert pairs == {(0, 0): (0, 4), (0, 1): (0, 0), (0, 2): (0, 2), (1, 0): (3, 1), (1, 1): (3, 3), (1, 2): (3, 0)}
    with pytest.raises(ValueError, match="match_heads"):
        match_within_layers(_profiles(small), _profiles(big))


def _permuted_minilm(out, seed: int):
    """MiniLM with each layer's heads permuted (a different permutation per layer); returns the permutations."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from rapids_attn.extract.model import resolve_model_name

    src = resolve_model_name("minilm-l6")
    model = AutoModel.from_pretrained(src)
    cfg = model.config
    d = cfg.hidden_size // cfg.num_attention_heads
    rng = np.random.default_rng(seed)
    perms = []
    with torch.no_grad():
        for layer in model.encoder.layer:
            perm = rng.permutation(cfg.num_attention_heads)
            idx = torch.as_tensor(np.concatenate([np.arange(p * d, (p + 1) * d) for p in perm]))
            att = layer.attention
            for lin in (att.self.query, att.self.key, att.self.value):
                lin.weight.copy_(lin.weight[idx])
                lin.bias.copy_(lin.bias[idx])
            att.output.dense.weight.copy_(att.output.dense.weight[:, idx])
            perms.append(perm)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return np.array(perms)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    from rapids_attn.data import read_examples
    from rapids_attn.jobfile import load_job
    from rapids_attn.pipeline import run_job

    tmp = tmp_path_factory.mktemp("match")
    quick = __import__("rapids_attn.data", fromlist=["x"]).__file__.replace("__init__.py", "quickstart.json")
    rows = [
        {"id": e.id, "question": e.text, "context": "", "topic": e.group, "answerable": e.label}
        for e in read_examples(quick, format="squad")[:16]
    ]
    data = tmp / "q.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    perms = _permuted_minilm(tmp / "minilm-permuted", seed=3)
    stores = []
    for name, model in (("original", "minilm-l6"), ("permuted", str(tmp / "minilm-permuted"))):
        job = make_job(tmp / name, model, data)
        job["data"]["text_fields"] = ["question"]
        cfg = load_job(None, raw=job)
        run_job(cfg, stages=("extract",))
        stores.append(zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r"))
    return stores, perms


def test_minilm_with_permuted_heads_is_matched_back_to_the_permutation(two_runs):
    (ga, gb), perms = two_runs
    a, b = head_profiles(ga), head_profiles(gb)
    assert a.features.shape[:2] == (6, 12) and a.names == b.names
    m = match_within_layers(a, b)
    np.testing.assert_array_equal(m.match, np.argsort(perms, axis=1))
    # the same function: the matched heads' profiles agree to float noise, far below the next-nearest head
    assert m.distance.max() < 1e-3 < m.margin.min()
    # whole layers: layer i of one run is most like layer i of the other, at a correlation of 1 (the
    # dissimilarities do not depend on the order of the heads)
    sim = layer_similarity(ga, gb)
    assert sim.shape == (6, 6)
    np.testing.assert_allclose(np.diag(sim), 1.0, atol=1e-6)
    assert (sim.argmax(1) == np.arange(6)).all()

"""A seeded probe set of repeated random-token sequences, for the induction detector.

An induction head attends, at the second occurrence of a token, to the token that followed its
first occurrence. Natural text has few long repeats, so the detector needs inputs that do: each
probe is L random words repeated once ("w1 ... wL w1 ... wL"). Words are drawn from the tokenizer's
own vocabulary and kept only if they are a single token, so the repeat is exact in token space.
For text-pair datasets the two halves are the pair, so the probe shares the dataset's shape.
"""

from __future__ import annotations

import numpy as np

from rapids_attn.data.example import Example
from rapids_attn.errors import DataError

PROBE_GROUP = "probe:repeated-tokens"


def single_token_words(tokenizer) -> list[str]:
    """Alphabetic vocabulary words (3+ letters) that the tokenizer encodes, after a space, as one token."""
    words = []
    for token in tokenizer.get_vocab():
        s = tokenizer.convert_tokens_to_string([token]).strip()
        if len(s) >= 3 and s.isascii() and s.isalpha() and s.islower():
            words.append(s)
    words = sorted(set(words))
    enc = tokenizer([" " + w for w in words], add_special_tokens=False)["input_ids"]
    return [w for w, ids in zip(words, enc) if len(ids) == 1]


def repeated_token_probes(tokenizer, count: int, length: int, seed: int, pairs: bool) -> list[Example]:
    words = single_token_words(tokenizer)
    if len(words) < length:
        raise DataError(
            f"data.probe: the tokenizer has only {len(words)} single-token words; set data.probe.length lower"
        )
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        seq = " ".join(rng.choice(words, length, replace=False))
        text, pair = (seq, seq) if pairs else (f"{seq} {seq}", None)
        out.append(Example(id=f"probe-{i}", text=text, text_pair=pair, group=PROBE_GROUP, label="probe"))
    return out

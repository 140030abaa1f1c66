"""Models compared head by head over the same inputs (issue 37): map-to-map measures computed block by block
from two models' queries and keys (:mod:`rapids_attn.compare.pairwise`) and per-head bootstrap intervals over
examples (:mod:`rapids_attn.compare.intervals`)."""

"""The Zarr v3 store: layout, creation and reuse rules, shard writes with done-markers, readers.

Arrays are example-major so a shard owns one chunk of rows and workers write without locks::

    features      (example, layer, head, feature)   float16 by default
    thumbnails    (example, layer, head, ty, tx)    uint8 on a square-root scale (decode_thumbnails)
    stats         (example, layer, head, stat)      float32, names in the ``stat`` coordinate
    profile       (example, layer, head, offset)    float16, mean attention at key = query + offset
    detectors     (example, layer, head, detector)  float32, duplicate-token and induction scores (NaN: no repeat)
    head_detectors (layer, head, detector)          float32, per-head mean over examples (explain stage)
    seq_len       (example,)  int32  tokens after truncation
    truncated     (example,)  bool
    example_id    (example,)  str    example_group, example_label likewise
    shards_done   (shard,)    bool   set only after a shard's rows are written
    reduced       (example, layer, head, component)  float16  written by the learn stage
    coords        (example, layer, head, xy)         float32  2-D coordinates
    cluster       (example, layer, head)             int32    -1 = noise (DBSCAN / HDBSCAN)

Every array carries dimension names, so ``xarray.open_zarr(store)`` reads it as one Dataset.
Root attributes hold the resolved job, its extraction key, the model, the layer and head indices,
and completion flags (``extract_complete``, ``learn_complete``) that are set last.
"""

from rapids_attn.store.zarr_store import (
    StoreLayout,
    create_store,
    done_shards,
    mark_learn,
    open_for_job,
    write_shard,
)

__all__ = ["StoreLayout", "create_store", "done_shards", "mark_learn", "open_for_job", "write_shard"]

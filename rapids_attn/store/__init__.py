"""The Zarr v3 store of a run: its schema, creation and reuse rules, shard writes with done-markers.

- :mod:`rapids_attn.store.schema` names every array and attribute (dims, dtype, writing stage).
- :mod:`rapids_attn.store.zarr_store` creates the store, decides whether an existing one can be
  reused (and never deletes what rapids_attn did not make), writes a shard's rows and then its
  done-marker, and sets each stage's completion flag.

Every array carries dimension names, so ``xarray.open_zarr(store)`` reads it as one Dataset.
"""

from rapids_attn.store.zarr_store import (
    StoreLayout,
    create_store,
    done_shards,
    mark_complete,
    open_for_job,
    write_shard,
)

__all__ = ["StoreLayout", "create_store", "done_shards", "mark_complete", "open_for_job", "write_shard"]

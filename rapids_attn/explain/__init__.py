"""Phase 3: turn the store into tables and a summary (``maps.parquet``, ``summary.json``)."""

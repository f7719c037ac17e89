"""Thin Ray actors around the engine: ShardWorker (one per TP rank > 0) and the replica."""

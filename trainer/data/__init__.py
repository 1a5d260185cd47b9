"""Training data: prompt sets, target regeneration and the shard store."""

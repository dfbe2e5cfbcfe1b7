"""Work over whole corpora: executors, shards, and the counting, encoding and evaluating jobs that run on
them (locally or as shard tasks)."""

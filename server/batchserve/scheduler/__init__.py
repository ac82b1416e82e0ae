"""Per-model scheduling: bounded priority queues, dynamic batching, instance pools."""

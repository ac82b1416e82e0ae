"""Per-model scheduling: bounded priority queues, dynamic batching under memory budgets,
instance pools.

Imports ``backends``, ``observability``, ``devices``, ``core`` and ``proto``; knows no
protocol and no model repository.
"""

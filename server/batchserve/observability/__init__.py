"""What the server tells its operator: Prometheus series and the statistics Triton reports,
refusal counts, logging and its runtime settings, trace settings.

Imports ``devices``, ``core`` and ``proto`` only, so the scheduler can record into it; the
collector that reads the live server at scrape time lives in ``runtime``.
"""

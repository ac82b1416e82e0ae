"""`make gpu-check`: every GPU test and the GPU benchmark in one run -> bench/GPU_RESULTS.md.

The modules that ``scripts/gpu_check.sh`` runs before the environment exists (``venv``,
``preflight``, ``requirements``) use the standard library only; the rest runs inside it.
"""

"""``python -m bench.gpu``: the harness (see ``bench.gpu.run``)."""

from bench.gpu.run import main

raise SystemExit(main())

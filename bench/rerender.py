"""Render RESULTS.md again from the figures a run saved beside it (RESULTS.json).

A change to the report or the targets then needs no new 40-minute run:

    python -m bench.rerender [bench/RESULTS.json] [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from bench import report, targets
from bench.common import ROOT
from bench.records import load


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rerender", description=__doc__)
    default = ROOT / "bench" / "RESULTS.json"
    parser.add_argument("figures", type=Path, nargs="?", default=default)
    parser.add_argument("--out", type=Path, help="default: the figures' file with .md")
    args = parser.parse_args(argv)
    if not args.figures.is_file():
        parser.error(f"{args.figures} does not exist: `make bench` writes it beside RESULTS.md")
    results = load(args.figures.read_text())
    out = args.out or args.figures.with_suffix(".md")
    out.write_text(report.render(results, targets.evaluate(results)))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

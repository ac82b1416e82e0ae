"""Whether a second benchmark run reproduces a first, target by target.

    python -m bench.compare bench/RESULTS.json NEW.json [--out FILE.md]

The benchmark is checked by running it again and asking that its ratios reproduce within
noise. A run measures its own noise where a target is judged on paired rounds: the spread
of the round figures. Two runs agree on such a target when their ranges of round figures
overlap. A figure taken in one window only (a mean batch at a point not taken in rounds)
carries no band, so its change is shown and left to the reader. Rounds taken back to back
(c=1) share one minute of this machine's speed, so their band is narrower than the drift
between runs. Exit status 1 when some target with a band falls outside it.
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import targets
from bench.records import load
from bench.targets import Verdict


class Agreement(enum.Enum):
    WITHIN = "within noise"
    OUTSIDE = "OUTSIDE noise"
    ONE_WINDOW = "one window each: no band"
    MISSING = "not measured in both"


@dataclass(frozen=True)
class Row:
    """One target as the two runs judged it."""

    target: str
    base: Verdict | None
    new: Verdict | None

    @property
    def agreement(self) -> Agreement:
        if self.base is None or self.new is None:
            return Agreement.MISSING
        base, new = _band(self.base), _band(self.new)
        if base is None or new is None:
            return Agreement.MISSING
        if len(self.base.rounds) < 2 and len(self.new.rounds) < 2:
            return Agreement.ONE_WINDOW
        overlap = base[0] <= new[1] and new[0] <= base[1]
        return Agreement.WITHIN if overlap else Agreement.OUTSIDE


def _band(verdict: Verdict) -> tuple[float, float] | None:
    """The range of the round figures, or the lone figure as a range of one point."""
    if verdict.rounds:
        return min(verdict.rounds), max(verdict.rounds)
    if verdict.figure is None:
        return None
    return verdict.figure, verdict.figure


def compare(base: Sequence[Verdict], new: Sequence[Verdict]) -> list[Row]:
    """Targets of either run, in the base run's order, then those only the new run has."""
    base_by, new_by = {v.target: v for v in base}, {v.target: v for v in new}
    names = list(dict.fromkeys([*base_by, *new_by]))
    return [Row(name, base_by.get(name), new_by.get(name)) for name in names]


def _number(value: float) -> str:
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def _cell(verdict: Verdict | None) -> str:
    if verdict is None or verdict.figure is None:
        return "—"
    text = _number(verdict.figure)
    if len(verdict.rounds) > 1:
        text += f" ({_number(min(verdict.rounds))}-{_number(max(verdict.rounds))})"
    return f"{text} {verdict.label}"


def render(rows: Sequence[Row], base_name: str, new_name: str) -> str:
    """A Markdown table: each run's figure (its round range) and verdict, and the agreement."""
    counts = {a: sum(r.agreement is a for r in rows) for a in Agreement}
    flips = [r.target for r in rows if r.base and r.new and r.base.passed != r.new.passed]
    lines = [
        f"# `{new_name}` against `{base_name}`",
        "",
        "Figure: the judged ratio, p99 (ms), c=1 overhead (ms) or mean batch; in brackets the "
        "range over paired rounds, the run's own noise.",
        "",
        "| target | base | new | reproduced |",
        "| --- | --- | --- | --- |",
        *(f"| {r.target} | {_cell(r.base)} | {_cell(r.new)} | {r.agreement.value} |" for r in rows),
        "",
        ", ".join(f"{counts[a]} {a.value}" for a in Agreement) + ".",
        f"Verdicts that changed: {', '.join(flips) if flips else 'none'}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    parser.add_argument("base", type=Path, help="a run's RESULTS.json")
    parser.add_argument("new", type=Path, help="another run's RESULTS.json")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    for path in (args.base, args.new):
        if not path.is_file():
            parser.error(f"{path} does not exist: `make bench` writes it beside RESULTS.md")
    judged = [targets.evaluate(load(path.read_text())) for path in (args.base, args.new)]
    rows = compare(*judged)
    text = render(rows, str(args.base), str(args.new))
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 1 if any(r.agreement is Agreement.OUTSIDE for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Dockerfiles as the official parser (the `dockerfile` package) reads them, split in stages."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import dockerfile


@dataclass(frozen=True)
class Stage:
    """One ``FROM`` and the instructions up to the next."""

    image: str
    name: str | None
    instructions: tuple[dockerfile.Command, ...]

    def all(self, instruction: str) -> list[dockerfile.Command]:
        return [c for c in self.instructions if c.cmd == instruction]

    def last(self, instruction: str) -> dockerfile.Command:
        found = self.all(instruction)
        assert found, f"stage {self.name or self.image} has no {instruction}"
        return found[-1]


def parse_dockerfile(path: Path) -> list[Stage]:
    stages: list[Stage] = []
    for command in dockerfile.parse_file(str(path)):
        if command.cmd == "FROM":
            value = command.value
            name = value[2] if len(value) == 3 and value[1].upper() == "AS" else None
            stages.append(Stage(value[0], name, ()))
        elif stages:
            current = stages[-1]
            stages[-1] = Stage(current.image, current.name, (*current.instructions, command))
    return stages


def server_env(stage: Stage) -> dict[str, str]:
    """The ``BATCHSERVE_*`` variables the stage's ``ENV`` lines set, as the server sees them."""
    env: dict[str, str] = {}
    for command in stage.all("ENV"):
        pairs = dict(zip(command.value[::2], command.value[1::2], strict=True))
        env.update({k: v for k, v in pairs.items() if k.startswith("BATCHSERVE_")})
    return env


def image_user(path: Path) -> str:
    """The ``USER`` the image runs as: the last one of its final stage."""
    return str(parse_dockerfile(path)[-1].last("USER").value[0])


def run_commands(stage: Stage) -> list[list[str]]:
    """Each shell command of each ``RUN``, split on ``&&``, as words."""
    commands = []
    for run in stage.all("RUN"):
        for part in " ".join(run.value).split("&&"):
            commands.append(shlex.split(part))
    return commands

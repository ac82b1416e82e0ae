"""`batchserve repo validate DIR`: check a model repository before serving it.

Prints each valid model's resolved configuration (a pbtxt a user can copy, headed by comment
lines naming the config file read and the served versions and files) and each problem on its
own line; the exit code is 0 only when every model is valid. ``--model-config-name`` and
``--disable-auto-complete-config`` check what a server given those flags would serve. At a
terminal, stderr also shows each model as it is checked and a closing summary (not with
--quiet).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from batchserve.core.progress import StageProgress

if TYPE_CHECKING:
    from batchserve.models.model_directory import ResolvedModel
    from batchserve.models.repository import ModelProblem, ModelRepository
    from batchserve.proto.model_config_pb2 import ModelConfig

PROG = "batchserve repo validate"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    repo = subparsers.add_parser("repo", help="inspect a model repository")
    actions = repo.add_subparsers(dest="repo_action", required=True, metavar="ACTION")
    validate = actions.add_parser(
        "validate",
        help="resolve and check every model; exit 1 if any is invalid or there is none",
        description="Resolve every model of a repository (config.pbtxt completed from the "
        "model file) and report each problem with the file and field at fault.",
    )
    validate.add_argument("directory", type=Path, metavar="DIR", help="the model repository")
    validate.add_argument(
        "-q", "--quiet", action="store_true", help="print only the problems (and no progress)"
    )
    validate.add_argument(
        "--model-config-name",
        metavar="NAME",
        help="check the configs a server with this --model-config-name serves: "
        "<model>/configs/NAME.pbtxt where it exists, else config.pbtxt",
    )
    validate.add_argument(
        "--disable-auto-complete-config",
        action="store_true",
        help="check as a server with this flag serves: nothing filled in from the model file",
    )
    validate.set_defaults(handler=validate_command)


def validate_command(args: argparse.Namespace) -> int:
    """Handler of `repo validate`; imports onnx only when run, so `batchserve --help` stays fast."""
    from batchserve.core.errors import NotFound
    from batchserve.core.settings import plain_config_name

    progress = StageProgress.for_stderr(PROG, quiet=args.quiet)
    try:
        config_name = args.model_config_name
        if config_name is not None:
            plain_config_name(config_name)
        repository = _repository(
            args.directory, progress, config_name, not args.disable_auto_complete_config
        )
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except NotFound as exc:
        print(f"{PROG}: {exc.message}", file=sys.stderr)
        return 1
    resolved, problems = repository.scan()
    if not resolved and not problems:
        print(f"{PROG}: no model directories in '{args.directory}'", file=sys.stderr)
        return 1
    if not args.quiet:
        _print_report(repository.roots[0], resolved, problems)
    else:
        for problem in problems:
            print("\n".join(problem.errors))
    invalid = ", ".join(problem.name for problem in problems)
    count = len(resolved) + len(problems)
    progress.finish(
        f"checked {count} model{'s' if count != 1 else ''}: {len(resolved)} valid, "
        f"{len(problems)} invalid{f' ({invalid})' if invalid else ''}"
    )
    return 1 if problems else 0


def _repository(
    directory: Path,
    progress: StageProgress,
    config_name: str | None = None,
    auto_complete: bool = True,
) -> ModelRepository:
    """The repository, telling ``progress`` of each model as the scan resolves it."""
    from batchserve.models.repository import ModelRepository

    class _Watched(ModelRepository):
        def resolve(self, name: str, config: ModelConfig | None = None) -> ResolvedModel:
            self._done += 1
            where = f"[{self._done}/{len(self._names)}] {name}"
            try:
                model = super().resolve(name, config)
            except Exception:
                progress.say(f"{where}: invalid")
                raise
            versions = [str(v.version) for v in model.versions]
            label = "versions" if len(versions) > 1 else "version"
            progress.say(f"{where}: valid, serves {label} {', '.join(versions)}")
            return model

        def scan(self) -> tuple[list[ResolvedModel], list[ModelProblem]]:
            self._names, self._done = self.names(), 0
            return super().scan()

    return _Watched(directory, config_name, auto_complete=auto_complete)


def _print_report(root: Path, resolved: list[ResolvedModel], problems: list[ModelProblem]) -> None:
    from batchserve.models.model_config import to_pbtxt

    blocks = [(model.name, _valid_block(root, model, to_pbtxt(model.config))) for model in resolved]
    blocks += [(problem.name, _invalid_block(problem)) for problem in problems]
    for _, block in sorted(blocks):
        print(block)
    print(f"{len(blocks)} models: {len(resolved)} valid, {len(problems)} invalid")


def _valid_block(root: Path, model: ResolvedModel, pbtxt: str) -> str:
    read = model.config_file if (root / model.config_file).is_file() else "the model file alone"
    lines = [f"# {model.name}: valid", f"#   config from {read}"]
    lines += [
        f"#   serves version {v.version} from {v.model_file.relative_to(root).as_posix()}"
        for v in model.versions
    ]
    return "\n".join([*lines, pbtxt])


def _invalid_block(problem: ModelProblem) -> str:
    count = len(problem.errors)
    header = f"# {problem.name}: invalid ({count} problem{'s' if count != 1 else ''})"
    return "\n".join([header, *problem.errors, ""])

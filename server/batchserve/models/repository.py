"""The model repositories on disk: which models exist, each resolved from its directory.

Triton's layout: ``<root>/<model>/config.pbtxt`` (optional) and
``<root>/<model>/<version>/model.onnx``, ``model.plan`` or ``model.pt2``. Resolving one model
(``model_directory``) never loads a runtime; scanning resolves every model and reports each
broken one without stopping at it.

Several roots (Triton's ``--model-repository`` given again) serve as one: a model is the
directory of its name in whichever root holds it. A name held by two roots is served from
neither, as Triton refuses to choose: it is listed as unavailable with Triton's reason, and
loading it fails with that reason.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from batchserve.core.backend_config import BackendConfig, parse_backend_config
from batchserve.core.errors import BatchserveError, NotFound
from batchserve.core.settings import ALL_MODELS, ModelControlMode, Settings
from batchserve.models.model_directory import InvalidModel, ResolvedModel, resolve_model
from batchserve.models.model_names import validate_model_name
from batchserve.proto.model_config_pb2 import ModelConfig

logger = logging.getLogger(__name__)

DUPLICATE_MODEL = "model appears in two or more repositories"
"""Triton's reason for a model name found in several repositories
(``model_repository_manager.h``)."""


@dataclass(frozen=True, slots=True)
class ModelProblem:
    """A model directory that cannot be served, with every problem found in it."""

    name: str
    errors: tuple[str, ...]


class ModelRepository:
    """One or more directories of models; reading them never loads a runtime."""

    def __init__(
        self,
        roots: Path | Sequence[Path],
        config_name: str | None = None,
        *,
        auto_complete: bool = True,
        backend_config: BackendConfig | None = None,
    ) -> None:
        """``config_name``: Triton's ``--model-config-name``, for every model resolved;
        ``auto_complete`` False: Triton's ``--disable-auto-complete-config``;
        ``backend_config``: Triton's ``--backend-config`` settings."""
        given = (roots,) if isinstance(roots, Path) else tuple(roots)
        for root in given:
            if not root.is_dir():
                raise NotFound(f"model repository '{root}' is not a directory")
        self.roots = tuple(dict.fromkeys(root.resolve() for root in given))
        self.config_name = config_name
        self.auto_complete = auto_complete
        self.backend_config = backend_config

    @classmethod
    def of(cls, settings: Settings) -> ModelRepository:
        """The repositories a server's settings name, read as they say."""
        return cls(
            settings.model_repository,
            settings.model_config_name,
            auto_complete=not settings.disable_auto_complete_config,
            backend_config=parse_backend_config(settings.backend_config),
        )

    def names(self) -> list[str]:
        """The model directories of every root, each name once, sorted; hidden entries and
        plain files are skipped."""
        return sorted({name for root in self.roots for name in _model_names(root)})

    def directories(self, name: str) -> list[Path]:
        """The directories of the model ``name``, one per root holding it: one for a model
        that can be served, none for an unknown one, more for a duplicate."""
        return [root / name for root in self.roots if (root / name).is_dir()]

    def duplicates(self) -> list[str]:
        """The names more than one root holds, sorted."""
        if len(self.roots) == 1:
            return []
        counts: dict[str, int] = {}
        for root in self.roots:
            for name in _model_names(root):
                counts[name] = counts.get(name, 0) + 1
        return sorted(name for name, count in counts.items() if count > 1)

    def resolve(self, name: str, config: ModelConfig | None = None) -> ResolvedModel:
        """The model, completed and validated; ``config`` (a load's override) is used
        instead of the directory's config.pbtxt (or named config) when given.

        Raises InvalidArgument for a name that is not a plain directory name, NotFound
        when there is no such directory, and InvalidModel (a ModelConfigError) listing every
        problem found.
        """
        name = validate_model_name(name)
        found = self.directories(name)
        if len(found) > 1:
            places = ", ".join(f"'{directory.parent}'" for directory in found)
            raise InvalidModel(name, [f"{DUPLICATE_MODEL} (batchserve: {places})"])
        return resolve_model(
            found[0].parent if found else self.roots[0],
            name,
            config,
            config_name=self.config_name,
            auto_complete=self.auto_complete,
            backend_config=self.backend_config,
        )

    def scan(self) -> tuple[list[ResolvedModel], list[ModelProblem]]:
        """Resolve every model; a broken entry is reported and never stops the others."""
        resolved: list[ResolvedModel] = []
        problems: list[ModelProblem] = []
        for name in self.names():
            try:
                resolved.append(self.resolve(name))
            except InvalidModel as exc:
                problems.append(ModelProblem(name, exc.problems))
            except BatchserveError as exc:
                problems.append(ModelProblem(name, (exc.message,)))
            except Exception as exc:
                logger.exception("unexpected error while resolving model '%s'", name)
                problems.append(ModelProblem(name, (f"{name}: {type(exc).__name__}: {exc}",)))
        return resolved, problems


def _model_names(root: Path) -> list[str]:
    """The model directories of one root."""
    names = []
    for entry in root.iterdir():
        if entry.name.startswith(".") or not entry.is_dir():
            logger.debug("%s: skipping %s (not a model directory)", root, entry.name)
        else:
            names.append(entry.name)
    return names


def startup_models(settings: Settings, repository: ModelRepository) -> list[str]:
    """The models a server loads as it starts: every one in the repository, or with control
    explicit those ``--load-model`` names (every one again for Triton's ``*``)."""
    if settings.model_control_mode is not ModelControlMode.EXPLICIT:
        return repository.names()
    if settings.load_model == (ALL_MODELS,):
        return repository.names()
    return list(settings.load_model)

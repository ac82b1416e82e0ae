"""Loading an ensemble: its composing models first, then Triton's checks against them.

As Triton's repository manager does, loading an ensemble loads the composing models that
are not loaded yet (one already loaded is used as it is), and an ensemble whose composing
model cannot be loaded is not loaded, in Triton's words ("ensemble 'e' depends on 'm'
which has no loaded version. ..."). As its dependency graph does, an ensemble naming a
model that is neither loaded nor in the repository once is refused before anything loads
("... contains models that are not available or ambiguous: ..."), and a chain of ensembles
that leads back to one being loaded is refused rather than waited on for ever
("circular dependency between ensembles: ...").
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping

from batchserve.core.errors import BatchserveError, ModelConfigError
from batchserve.models.decoupled import builtin_backend
from batchserve.models.ensemble_config import (
    answers_many,
    composing_models,
    composing_problems,
    decoupled_labels,
    ensemble_steps,
)
from batchserve.models.labels import LabelMap
from batchserve.models.model_table import ServedVersion
from batchserve.proto.model_config_pb2 import ModelConfig

CIRCULAR = "circular dependency between ensembles: "

_LOADING: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "ensembles_loading", default=()
)
"""The ensembles whose loads led to this one, in this load's task."""


async def composing_configs(
    config: ModelConfig,
    load: Callable[[str], Awaitable[None]],
    served: Callable[[str, str], ServedVersion],
    available: Callable[[str], bool],
) -> dict[str, ModelConfig]:
    """Load what ``config``'s steps need and check the steps against it: each composing
    model's config as loaded. ``served`` looks a version up as requests do; ``available``
    says whether a model is loaded or can be (in the repository once)."""
    name = config.name
    missing = sorted({model for model in composing_models(config) if not available(model)})
    if missing:
        raise ModelConfigError(
            f"ensemble {name} contains models that are not available or ambiguous: "
            + ", ".join(missing)
        )
    chain = _LOADING.get()
    mark = _LOADING.set((*chain, name))
    try:
        for model in composing_models(config):
            if model == name or model in chain:
                # Triton's words: from the ensemble the circle starts at, back to it
                raise ModelConfigError(
                    f"{CIRCULAR}{model} -> ... -> {name} -> {model} "
                    f"(batchserve: {' -> '.join((*chain, name, model))})"
                )
            await _loaded(name, model, load, served)
    finally:
        _LOADING.reset(mark)
    configs = {}
    for step in config.ensemble_scheduling.step:
        version = str(step.model_version) if step.model_version > 0 else ""
        try:
            configs[step.model_name] = served(step.model_name, version).config
        except BatchserveError:
            raise ModelConfigError(
                f"ensemble '{name}' depends on '{step.model_name}' whose required version "
                f"{step.model_version} is not loaded."
            ) from None
    problems = (
        composing_problems(config, configs)
        or list(_unsupported(configs))
        or decoupled_labels(config, configs)[1]
    )
    if problems:
        raise ModelConfigError("\n".join(problems))
    return configs


def _unsupported(configs: Mapping[str, ModelConfig]) -> Iterator[str]:
    """Composing models batchserve cannot run as a step (yet): a built-in backend's model
    that is not decoupled, whose many replies a step could not pass on."""
    for model, config in configs.items():
        if (backend := builtin_backend(config)) is not None and not answers_many(config):
            yield (
                f"model '{model}' is served by the built-in backend '{backend}', which may "
                "answer any number of times, and is not decoupled: batchserve does not "
                "support it in an ensemble (yet)"
            )


def inherited_labels(
    config: ModelConfig, own: LabelMap, served: Callable[[str, str], ServedVersion]
) -> LabelMap:
    """The ensemble's output labels: its own ``label_filename``s, and for an output without
    one those of the composing model's output that writes it, as Triton's model lifecycle
    gives them (an ensemble's nested ensemble has inherited its own already)."""
    labels = dict(own)
    outputs = {spec.name for spec in config.output}
    for step in ensemble_steps(config):
        composing = served(step.model, step.version).labels
        for model_output, tensor in step.outputs:
            if tensor in outputs and tensor not in labels and model_output in composing:
                labels[tensor] = composing[model_output]
    return labels


async def _loaded(
    ensemble: str,
    model: str,
    load: Callable[[str], Awaitable[None]],
    served: Callable[[str, str], ServedVersion],
) -> None:
    try:
        served(model, "")
        return  # loaded already: used as it is
    except BatchserveError:
        pass
    try:
        await load(model)
    except BatchserveError as exc:
        if exc.message.startswith(CIRCULAR):  # every ensemble on the circle says it, as Triton's
            raise ModelConfigError(exc.message) from None
        raise ModelConfigError(
            f"ensemble '{ensemble}' depends on '{model}' which has no loaded version. Model "
            f"'{model}' loading failed with error: {exc.message}"
        ) from None


class EnsembleDependencies:
    """Which loaded ensembles use which models, and which models were loaded only because
    an ensemble needed them: what an unload touches beyond the model it names.

    As Triton's repository manager: unloading a composing model leaves the ensembles that
    use it without a loaded version of it, so they are unloaded too; unloading an ensemble
    with ``unload_dependents`` also unloads the composing models loaded along with it that
    no other ensemble uses and no one asked to load.
    """

    def __init__(self) -> None:
        self._uses: dict[str, frozenset[str]] = {}
        self._implicit: set[str] = set()

    def asked_for(self, name: str) -> None:
        """A load named ``name`` itself: it is no longer only a composing model."""
        self._implicit.discard(name)

    def loaded_along(self, name: str) -> None:
        """``name`` was loaded because an ensemble needed it."""
        self._implicit.add(name)

    def ensemble_loaded(self, ensemble: str, composing: Iterable[str]) -> None:
        self._uses[ensemble] = frozenset(composing)

    def users_of(self, name: str) -> list[str]:
        """The loaded ensembles whose steps run ``name``."""
        return sorted(e for e, models in self._uses.items() if name in models)

    def unloaded(self, name: str) -> list[str]:
        """Forget ``name``; the composing models it alone kept loaded, which
        ``unload_dependents`` unloads with it."""
        self._implicit.discard(name)
        composing = self._uses.pop(name, frozenset())
        still_used = {m for models in self._uses.values() for m in models}
        return sorted(m for m in composing if m in self._implicit and m not in still_used)

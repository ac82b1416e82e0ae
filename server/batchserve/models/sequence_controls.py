"""Triton's checks of a sequence model's ``control_input`` list, in its words
(``model_config_utils.cc``: ``GetBooleanSequenceControlProperties`` and
``GetTypedSequenceControlProperties``).

Each control input has a name, no tensor is named twice, each kind is given at most once;
START, END and READY say their false and true values in exactly one of
``int32_false_true``, ``fp32_false_true`` and ``bool_false_true``, two entries; CORRID
says none of them (its type is ``data_type``). The sequence batcher reads the values by
position, so a config it would misread is refused here, at load.
"""

from __future__ import annotations

from batchserve.proto.model_config_pb2 import ModelConfig, ModelSequenceBatching

Control = ModelSequenceBatching.Control
_VALUE_LISTS = ("int32_false_true", "fp32_false_true", "bool_false_true")
_EITHER = "'int32_false_true', 'fp32_false_true' or 'bool_false_true'"


def control_problems(config: ModelConfig) -> list[str]:
    """Every problem of the config's control inputs, each once, in Triton's words."""
    name = config.name
    problems: list[str] = []
    seen: set[str] = set()
    for control_input in config.sequence_batching.control_input:
        if not control_input.name:
            problems.append(f"sequence batching control tensor must have a name for {name}")
        elif control_input.name in seen:
            problems.append(
                f"sequence batching control tensor '{control_input.name}' is specified for "
                f"multiple control kinds for {name}"
            )
        seen.add(control_input.name)
    for kind in (Control.CONTROL_SEQUENCE_START, Control.CONTROL_SEQUENCE_END,
                 Control.CONTROL_SEQUENCE_READY, Control.CONTROL_SEQUENCE_CORRID):  # fmt: skip
        problems += _kind_problems(config, kind)
    return list(dict.fromkeys(problems))


def _kind_problems(config: ModelConfig, kind: int) -> list[str]:
    kind_name = Control.Kind.Name(kind)  # type: ignore[arg-type]
    where = f"{kind_name} for {config.name}"
    controls = [
        control
        for control_input in config.sequence_batching.control_input
        for control in control_input.control
        if control.kind == kind
    ]
    problems = []
    if len(controls) > 1:
        problems.append(
            f"sequence batching specifies multiple {kind_name} tensors for {config.name}"
        )
    for control in controls:
        given = [field for field in _VALUE_LISTS if len(getattr(control, field))]
        if kind == Control.CONTROL_SEQUENCE_CORRID:
            if given:
                problems.append(f"sequence batching must not specify either {_EITHER} for {where}")
        elif not given:
            problems.append(f"sequence batching must specify either {_EITHER} for {where}")
        elif len(given) > 1:
            problems.append(
                "sequence batching specifies more than one from 'int32_false_true', "
                f"'fp32_false_true' and 'bool_false_true' for {where}"
            )
        elif len(getattr(control, given[0])) != 2:
            problems.append(
                f"sequence batching control '{given[0]}' must have exactly 2 entries for {where}"
            )
    return problems

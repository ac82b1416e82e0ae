"""Triton's restricted APIs and protocols: how the groups are read, which endpoints each
covers, and Triton's refusals of a command line it would not start with."""

from __future__ import annotations

import re

import pytest
from batchserve.core.restrictions import CATEGORIES, Restriction, parse_restrictions
from batchserve.grpc.restricted import METHOD_CATEGORIES
from batchserve.proto import grpc_service_pb2 as pb
from batchserve.rest.restricted import api_category


def test_groups_are_read_as_triton_reads_them() -> None:
    """L0_http's server command line: two groups, two headers."""
    groups = ("model-repository:admin-key=admin-value", "inference,metadata:infer-key=infer-value")
    assert parse_restrictions(groups, option="--http-restricted-api", kind="api") == {
        "model-repository": Restriction("admin-key", "admin-value"),
        "inference": Restriction("infer-key", "infer-value"),
        "metadata": Restriction("infer-key", "infer-value"),
    }
    grpc = parse_restrictions(
        ["shared-memory:Admin=v=1"], option="--grpc-restricted-protocol", kind="protocol",
        header_prefix="triton-grpc-protocol-",
    )  # fmt: skip
    assert grpc == {"shared-memory": Restriction("triton-grpc-protocol-admin", "v=1")}


@pytest.mark.parametrize(
    ("groups", "refusal"),
    [
        (["model-repository,health:k1=v1", "metadata,health:k2=v2"],
         "restricted api 'health' can not be specified in multiple config groups"),
        (["model-reposit,health:k1=v1"], "unknown restricted api 'model-reposit' "),
        (["health"], "--http-restricted-api option format is '<config name>:<setting>=<value>'"),
        (["health:k1"], "option format is"),
        (["health:=v"], "option format is"),
        ([":k=v"], "option format is"),
    ],
)  # fmt: skip
def test_a_group_triton_would_refuse_is_refused_in_its_words(
    groups: list[str], refusal: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(refusal)):
        parse_restrictions(groups, option="--http-restricted-api", kind="api")


@pytest.mark.parametrize(
    ("path", "category"),
    [
        ("/v2/health/live", "health"),
        ("/v2/health/ready", "health"),
        ("/v2/models/m/ready", "health"),
        ("/v2/models/m/versions/2/ready", "health"),
        ("/v2", "metadata"),
        ("/v2/models/m", "metadata"),
        ("/v2/models/m/versions/2", "metadata"),
        ("/v2/models/m/infer", "inference"),
        ("/v2/models/m/versions/1/infer", "inference"),
        ("/v2/models/m/generate", "inference"),
        ("/v2/models/m/generate_stream", "inference"),
        ("/v2/models/m/config", "model-config"),
        ("/v2/models/stats", "statistics"),
        ("/v2/models/m/stats", "statistics"),
        ("/v2/repository/index", "model-repository"),
        ("/v2/repository/models/m/load", "model-repository"),
        ("/v2/systemsharedmemory/status", "shared-memory"),
        ("/v2/cudasharedmemory/region/r/register", "shared-memory"),
        ("/v2/trace/setting", "trace"),
        ("/v2/models/m/trace/setting", "trace"),
        ("/v2/logging", "logging"),
        ("/metrics", None),
        ("/trace/setting", None),
        ("/v2/models/m/unknown", None),
    ],
)
def test_each_http_path_falls_in_tritons_group(path: str, category: str | None) -> None:
    assert api_category(path) == category


def test_every_grpc_method_of_the_service_is_in_a_group() -> None:
    """A method added to the service and left out here would never be restricted."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    methods = {f"/{service.full_name}/{m.name}" for m in service.methods}
    assert methods <= METHOD_CATEGORIES.keys()
    assert set(METHOD_CATEGORIES.values()) == set(CATEGORIES)

import grpc
import pytest
from batchserve.core import errors

ALL_ERRORS = [
    cls
    for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, errors.BatchserveError)
]


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_every_error_has_an_explicit_mapping_on_both_protocols(cls: type) -> None:
    # An error reaching the fallback row would be sent as a 500 by accident.
    mapped = [c for c in cls.__mro__ if c in errors.HTTP_STATUS and c is not BaseException]
    assert mapped or cls is errors.BatchserveError
    assert set(errors.HTTP_STATUS) == set(errors.GRPC_STATUS)


@pytest.mark.parametrize(
    ("error", "http", "code"),
    [
        (errors.InvalidArgument("x"), 400, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.ModelConfigError("x"), 400, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.AlreadyExists("x"), 400, grpc.StatusCode.ALREADY_EXISTS),  # as Triton maps it
        (errors.NotFound("x"), 404, grpc.StatusCode.NOT_FOUND),
        (errors.Overloaded("x"), 503, grpc.StatusCode.UNAVAILABLE),
        (errors.DeadlineExceeded("x"), 504, grpc.StatusCode.DEADLINE_EXCEEDED),
        (errors.OutOfMemory("x"), 500, grpc.StatusCode.INTERNAL),
        (ValueError("boom"), 500, grpc.StatusCode.INTERNAL),
    ],
)
def test_status_is_found_along_the_mro(error: Exception, http: int, code: grpc.StatusCode) -> None:
    assert errors.http_status(error) == http
    assert errors.grpc_status(error) == code


def test_unexpected_errors_do_not_leak_their_message() -> None:
    assert errors.public_message(KeyError("/secret/path")) == "internal error: KeyError"
    assert errors.public_message(errors.NotFound("model 'x' not found")) == "model 'x' not found"

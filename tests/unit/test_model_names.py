"""What a model name may be, and Triton's words when it may not."""

import pytest
from batchserve.core.errors import InvalidArgument
from batchserve.models.model_names import requested_model_name, validate_model_name


@pytest.mark.parametrize(
    "name",
    [
        "",
        " ",
        "..",
        ".",
        "../x",
        "a/b",
        "a\\b",
        "a\0b",
        ".hidden",
        "%2e%2e%2f",
        " x",
        "a\nb",
        "x" * 256,
    ],
)
def test_names_that_are_not_plain_directory_names(name: str) -> None:
    with pytest.raises(InvalidArgument, match=r"^(invalid model name|Model name cannot be empty)"):
        validate_model_name(name)
    # asked for in a request, such a name is an unknown model to Triton's clients
    with pytest.raises(InvalidArgument, match=r"^Request for unknown model: .*invalid model name"):
        requested_model_name(name)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("", "Model name cannot be empty. Please enter a valid name to deploy."),
        ("\t", "Model name cannot be empty. Please enter a valid name to deploy."),
        ("..", "invalid model name '..', model name must not contain path traversal characters"),
        ("a/../b", "invalid model name 'a/../b', model name must not contain path traversal"),
        ("/etc/passwd", "invalid model name '/etc/passwd', model name must not contain path"),
        ("...", "invalid model name '...': it starts with '.'"),
    ],
)
def test_load_and_unload_refuse_names_in_tritons_words(name: str, text: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        validate_model_name(name)
    assert refused.value.message.startswith(text)


@pytest.mark.parametrize("name", ["digits_cnn", "char-lstm.v2", "modèle", "x" * 255])
def test_plain_names_pass(name: str) -> None:
    assert validate_model_name(name) == name

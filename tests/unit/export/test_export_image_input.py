"""--normalize and --layout: what they parse to, what each error says, and the conversion's
numbers (numpy reference, and the module the graph starts with) against a hand computation."""

import re

import numpy as np
import pytest
import torch
from batchserve.core.errors import InvalidArgument
from batchserve.export.image_input import DEFAULT_SCALE, ImageInput, parse_normalize
from batchserve.export.image_module import BytesImageModule
from batchserve.export.inputs import random_inputs
from batchserve.export.spec import ExportSpec, InputSpec, parse_input_spec

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
NHWC = "image:UINT8:batch,8,8,3"


def _inputs(*texts: str) -> tuple[InputSpec, ...]:
    return tuple(parse_input_spec(text) for text in texts)


@pytest.mark.parametrize(
    "items",
    [
        ["mean=0.485,0.456,0.406", "std=0.229,0.224,0.225"],
        ["mean=0.485,0.456,0.406,std=0.229,0.224,0.225"],
        ["std=0.229,0.224,0.225", "mean=0.485,0.456,0.406", "scale=1/255"],
        ["mean=0.485", "0.456", "0.406", "std=0.229,0.224,0.225", "input=image"],
        ["mean=0.485,0.456,0.406 std=0.229,0.224,0.225"],
        ["mean=0.485,0.456,0.406;std=0.229,0.224,0.225"],
    ],
)
def test_normalize_spellings_parse_to_the_same_conversion(items: list[str]) -> None:
    assert parse_normalize(items, None, _inputs(NHWC)) == ImageInput(
        "image", "NHWC", MEAN, STD, DEFAULT_SCALE
    )


def test_defaults_are_bytes_to_0_1_with_no_normalisation() -> None:
    image = parse_normalize(["scale=16/255"], None, _inputs("image:UINT8:batch,8,8,1"))
    assert image == ImageInput("image", "NHWC", (0.0,), (1.0,), 16 / 255)
    assert parse_normalize(["mean=0.5"], None, _inputs(NHWC)).scale == pytest.approx(1 / 255)


@pytest.mark.parametrize(
    ("dims", "mean", "layout"),
    [
        ("batch,224,224,3", "0.5", "NHWC"),
        ("batch,3,224,224", "0.5", "NCHW"),
        ("batch,8,8,1", "0", "NHWC"),
        ("batch,1,28,28", "0", "NCHW"),
        ("batch,h,w,4", "0", "NHWC"),
        ("batch,4,8,3", "0.1,0.2,0.3", "NHWC"),  # three means: the 3 is the channel axis
        ("batch,3,8,4", "0.1,0.2,0.3", "NCHW"),
        ("2,8,8,3", "0.5", "NHWC"),
    ],
)
def test_layout_is_told_from_where_the_channels_sit(dims: str, mean: str, layout: str) -> None:
    inputs = _inputs(f"image:UINT8:{dims}")
    assert parse_normalize([f"mean={mean}"], None, inputs).layout == layout


def test_an_explicit_layout_wins_over_the_guess() -> None:
    inputs = _inputs("image:UINT8:batch,3,8,3")
    assert parse_normalize(["mean=0"], "NCHW", inputs).layout == "NCHW"
    with pytest.raises(InvalidArgument, match="say --layout NHWC or --layout NCHW"):
        parse_normalize(["mean=0"], None, inputs)


def test_the_uint8_input_among_several_is_found_or_named() -> None:
    inputs = _inputs("scale:FP32:batch,1", NHWC)
    assert parse_normalize(["mean=0"], None, inputs).input == "image"
    two = _inputs(NHWC, "mask:UINT8:batch,8,8,1")
    with pytest.raises(InvalidArgument, match=r"several UINT8 inputs \(image, mask\)"):
        parse_normalize(["mean=0"], None, two)
    assert parse_normalize(["input=mask"], None, two).input == "mask"


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["0.5", "mean=0.5"], "expected KEY=VALUE, got '0.5'"),
        (["mean=0.5", "median=1"], "unknown key 'median' (expected input, mean, std, scale)"),
        (["mean=0.5", "mean=0.4"], "mean is given twice"),
        (["mean=", "std=1"], "mean= has no value"),
        (["mean=a,b,c"], "mean=a,b,c: expected numbers"),
        (["std=0.2,0,0.2"], "std: every value must be > 0"),
        (["mean=nan"], "mean: give finite numbers"),
        (["scale=0"], "scale=0.0: must be a finite number > 0"),
        (["scale=1/0"], "scale=1/0: expected a number or A/B"),
        (["scale=x/255"], "scale=x/255: expected a number or A/B"),
    ],
)
def test_bad_normalize_arguments_say_what_is_wrong(items: list[str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=f"^--normalize.*{re.escape(message)}"):
        parse_normalize(items, None, _inputs(NHWC))


def test_normalize_needs_a_uint8_input() -> None:
    with pytest.raises(InvalidArgument, match=r"needs a UINT8 input .*: 'image' is FP32"):
        parse_normalize(["mean=0.5"], None, _inputs("image:FP32:batch,8,8,3"))
    spec_error = "needs a UINT8 input .*: input 'image' is INT8"
    with pytest.raises(InvalidArgument, match=spec_error):
        _spec("image:INT8:batch,8,8,3", ImageInput("image"))


def _spec(text: str, image: ImageInput, max_batch_size: int = 8) -> ExportSpec:
    return ExportSpec(
        "m", _inputs(text), max_batch_size=max_batch_size, image_input=image, batch_sizes=(2,)
    )


@pytest.mark.parametrize(
    ("text", "image", "message"),
    [
        (
            "image:UINT8:batch,8,8,3",
            ImageInput("picture"),
            r"input=picture: no such input \(image\)",
        ),
        ("image:UINT8:batch,8,3", ImageInput("image"), "has dims batch,8,3; an image is"),
        ("image:UINT8:batch,8,8,c", ImageInput("image"), "channel axis .*'c'.* a fixed size"),
        (
            "image:UINT8:batch,8,8,3",
            ImageInput("image", mean=(0.1, 0.2)),
            "mean has 2 values for the 3 channels of input 'image' \\(NHWC\\); give 1 or 3",
        ),
        (
            "image:UINT8:batch,3,8,8",
            ImageInput("image", "NCHW", std=(1, 1, 1, 1)),
            "std has 4 values for the 3 channels",
        ),
    ],
)
def test_spec_refuses_an_image_input_that_does_not_fit(
    text: str, image: ImageInput, message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        _spec(text, image)


def test_layout_must_be_nhwc_or_nchw() -> None:
    with pytest.raises(InvalidArgument, match="--layout 'HWC': expected NHWC or NCHW"):
        ImageInput("image", "HWC")


def test_a_spec_without_batch_axis_takes_an_image_of_three_axes() -> None:
    spec = _spec("image:UINT8:8,8,3", ImageInput("image"), max_batch_size=0)
    twin = ImageInput("image").float_spec(spec)
    assert twin.inputs[0].dims == (3, 8, 8)


def test_float_spec_is_the_modules_own_signature() -> None:
    inputs = _inputs("image:UINT8:batch,h,w,3:0..200", "scale:FP32:batch,1")
    spec = ExportSpec("m", inputs, image_input=ImageInput("image"))
    twin = ImageInput("image").float_spec(spec)
    assert [str(item) for item in twin.inputs] == ["image:FP32:batch,3,h,w", "scale:FP32:batch,1"]
    assert twin.image_input is None
    assert (twin.name, twin.batch_sizes, twin.max_batch_size) == ("m", (1, 3, 8), 64)


def test_to_float_matches_a_hand_computation() -> None:
    image = np.array([[[[0, 128, 255], [51, 102, 204]]]], dtype=np.uint8)  # N=1, H=1, W=2, C=3
    converted = ImageInput("image", "NHWC", MEAN, STD).to_float(image)
    assert converted.shape == (1, 3, 1, 2)
    assert converted.dtype == np.float32
    for c in range(3):
        for w in range(2):
            expected = (image[0, 0, w, c] / 255 - MEAN[c]) / STD[c]
            assert converted[0, c, 0, w] == pytest.approx(expected, rel=1e-6)


def test_nchw_bytes_are_only_scaled_and_normalised() -> None:
    image = np.arange(2 * 3 * 2 * 2, dtype=np.uint8).reshape(2, 3, 2, 2)
    converted = ImageInput("image", "NCHW", MEAN, STD, 2.0).to_float(image)
    expected = (image * 2.0 - np.array(MEAN)[:, None, None]) / np.array(STD)[:, None, None]
    np.testing.assert_allclose(converted, expected, rtol=1e-6)


def test_convert_touches_only_the_image() -> None:
    lengths = np.array([[3]], dtype=np.int64)
    arrays = {"image": np.zeros((1, 2, 2, 1), dtype=np.uint8), "lengths": lengths}
    converted = ImageInput("image", "NHWC", (0.5,), (0.5,)).convert(arrays)
    assert converted["lengths"] is lengths
    np.testing.assert_array_equal(converted["image"], np.full((1, 1, 2, 2), -1.0, np.float32))


class _Echo(torch.nn.Module):
    def forward(self, scale: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        return image * scale


@pytest.mark.parametrize(("layout", "shape"), [("NHWC", (4, 5, 6, 3)), ("NCHW", (4, 3, 5, 6))])
def test_the_graphs_first_nodes_compute_what_numpy_does(
    layout: str, shape: tuple[int, ...]
) -> None:
    image = ImageInput("image", layout, MEAN, STD)
    module = BytesImageModule(_Echo(), ("scale", "image"), image, rank=4)
    raw = np.random.default_rng(0).integers(0, 256, size=shape).astype(np.uint8)
    scale = torch.full((4, 1, 1, 1), 2.0)
    with torch.no_grad():
        got = module(scale, torch.from_numpy(raw))
    assert got.dtype == torch.float32
    assert tuple(got.shape) == (4, 3, 5, 6)
    np.testing.assert_allclose(got.numpy(), 2 * image.to_float(raw), rtol=1e-5, atol=1e-6)


def test_an_image_input_is_tested_over_every_byte_value() -> None:
    rng = np.random.default_rng(0)
    image = ImageInput("image")
    spec = ExportSpec("m", _inputs(NHWC), image_input=image, batch_sizes=(8,))
    values = random_inputs(spec, {"batch": 8}, rng)["image"]
    assert values.dtype == np.uint8
    assert (values.min(), values.max()) == (0, 255)
    declared = ExportSpec("m", _inputs(NHWC + ":0..16"), image_input=image)
    assert random_inputs(declared, {"batch": 8}, rng)["image"].max() <= 16
    plain = ExportSpec("m", _inputs(NHWC))  # a UINT8 input the module takes as it is
    assert random_inputs(plain, {"batch": 8}, rng)["image"].max() <= 9

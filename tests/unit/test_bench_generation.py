"""bench.generation's requests decode, by the server's own decoder, to what it means to
send; its table's ratio is over the one-generation level."""

from __future__ import annotations

from batchserve.grpc.codec import decode_infer_request

from bench.generation import Level, _request, render


def test_a_bench_request_is_the_generation_it_describes() -> None:
    request = decode_infer_request(_request("def f(", 64, 7))
    values = {t.name: t.data.reshape(-1)[0] for t in request.inputs}
    assert values == {"text_input": b"def f(", "max_tokens": 64,
                      "temperature": 0.800000011920929, "random_seed": 7}  # fmt: skip
    assert request.model_name == "char_lstm_generate"


def test_the_table_compares_each_level_with_one_generation_alone() -> None:
    alone = Level(1, characters=800, seconds=1.0, first_ms=[10.0, 12.0], rows_per_step=1.0)
    many = Level(8, characters=2400, seconds=1.0, first_ms=[30.0, 40.0], rows_per_step=7.5)
    table = render([alone, many], 1.0, 64)
    assert "| 8 | 2,400 | 3.0 | 300 | 35.0 |" in table

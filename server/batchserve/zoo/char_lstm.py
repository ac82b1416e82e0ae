"""A character-level LSTM language model trained on the Python standard library's own source.

Inputs are padded token ids ``tokens`` [batch, seq] and each row's true length
``lengths`` [batch, 1]; the output is the logits of the character that follows the
last real token. The LSTM is causal, so padding after a row's end cannot change its
answer: rows of different lengths batch together and give the same result as alone.
"""

from __future__ import annotations

import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

PAD, UNKNOWN, NEWLINE = 0, 1, 2
FIRST_PRINTABLE = ord(" ")
VOCAB_SIZE = 3 + (ord("~") - FIRST_PRINTABLE + 1)  # pad, unknown, newline, ' '..'~'

# Pure-Python standard-library modules present in every CPython >= 3.11.
CORPUS_FILES = (
    "argparse.py",
    "calendar.py",
    "csv.py",
    "dataclasses.py",
    "difflib.py",
    "enum.py",
    "fractions.py",
    "functools.py",
    "heapq.py",
    "json/decoder.py",
    "json/encoder.py",
    "pprint.py",
    "shlex.py",
    "statistics.py",
    "string.py",
    "textwrap.py",
)


def encode(text: str) -> np.ndarray:
    """Token ids (int64) for text; characters outside printable ASCII map to UNKNOWN."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    ids = codes - FIRST_PRINTABLE + 3
    ids[(codes < FIRST_PRINTABLE) | (codes > ord("~"))] = UNKNOWN
    ids[codes == ord("\n")] = NEWLINE
    return ids


def decode_id(token: int) -> str:
    """The character a token id stands for ('' for padding, U+FFFD for unknown)."""
    if token == NEWLINE:
        return "\n"
    if token >= 3:
        return chr(token - 3 + FIRST_PRINTABLE)
    return "" if token == PAD else "\ufffd"


HIDDEN, LAYERS = 128, 2


class CharLSTM(nn.Module):
    """Embedding, stacked LSTM, linear head over the vocabulary."""

    def __init__(self, embed: int = 32, hidden: int = HIDDEN, layers: int = LAYERS) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB_SIZE, embed, padding_idx=PAD)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, VOCAB_SIZE)

    def all_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-character logits at every position, [batch, seq, vocab] (for training)."""
        out, _ = self.lstm(self.embed(tokens))
        logits: torch.Tensor = self.head(out)
        return logits

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        last = (lengths - 1).clamp(min=0).unsqueeze(-1).expand(-1, 1, out.size(-1))
        logits: torch.Tensor = self.head(out.gather(1, last).squeeze(1))
        return logits


def build() -> CharLSTM:
    """Factory for `batchserve export batchserve.zoo.char_lstm:build`."""
    return CharLSTM()


@dataclass(frozen=True)
class Corpus:
    """Token ids of the training text and of the held-out tail of every file."""

    train: np.ndarray
    held_out: np.ndarray


def load_corpus(held_out_fraction: float = 0.1) -> Corpus:
    """The last tenth of each source file is held out, so evaluation text is unseen."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    train, held_out = [], []
    for name in CORPUS_FILES:
        ids = encode((stdlib / name).read_text(encoding="utf-8"))
        cut = int(len(ids) * (1 - held_out_fraction))
        train.append(ids[:cut])
        held_out.append(ids[cut:])
    return Corpus(np.concatenate(train), np.concatenate(held_out))


def _windows(ids: np.ndarray, starts: np.ndarray, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = np.stack([ids[s : s + length + 1] for s in starts])
    return torch.from_numpy(rows[:, :-1]), torch.from_numpy(rows[:, 1:])


def train(
    corpus: Corpus, steps: int = 1000, seq_len: int = 96, batch: int = 64, seed: int = 0
) -> tuple[CharLSTM, float]:
    """Teacher-forced training on random windows; returns the model and held-out accuracy."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = CharLSTM()
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, steps)
    for _ in range(steps):
        starts = rng.integers(0, len(corpus.train) - seq_len - 1, size=batch)
        x, y = _windows(corpus.train, starts, seq_len)
        optimiser.zero_grad()
        logits = model.all_logits(x)
        nn.functional.cross_entropy(logits.reshape(-1, VOCAB_SIZE), y.reshape(-1)).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        schedule.step()
    return model.eval(), held_out_accuracy(model, corpus.held_out, seq_len)


@torch.no_grad()
def held_out_accuracy(model: CharLSTM, ids: np.ndarray, seq_len: int) -> float:
    """Next-character accuracy over non-overlapping held-out windows."""
    starts = np.arange(0, len(ids) - seq_len - 1, seq_len)
    correct = total = 0
    for chunk in np.array_split(starts, max(1, len(starts) // 256)):
        x, y = _windows(ids, chunk, seq_len)
        predicted = model.eval().all_logits(x).argmax(dim=-1)
        correct += int((predicted == y).sum())
        total += y.numel()
    return correct / total


class CharLSTMStep(nn.Module):
    """One step of a CharLSTM, its state carried outside: what a sequence batcher runs.

    ``token`` [batch, 1] is the next character; ``h_in`` and ``c_in`` [batch, layers,
    hidden] are the state after the characters before it (zeros at the start). Returns the
    logits of the character after ``token`` and the state after it.
    """

    def __init__(self, model: CharLSTM) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, token: torch.Tensor, h_in: torch.Tensor, c_in: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        state = (h_in.transpose(0, 1).contiguous(), c_in.transpose(0, 1).contiguous())
        out, (h, c) = self.model.lstm(self.model.embed(token), state)
        logits: torch.Tensor = self.model.head(out[:, -1])
        return logits, h.transpose(0, 1), c.transpose(0, 1)


_ONNX_GATES = (0, 2, 3, 1)
"""ONNX's LSTM stacks its gates input, output, forget, cell; torch's input, forget, cell,
output: torch's gate k is ONNX's gate _ONNX_GATES[k]."""


def from_onnx(path: Path) -> CharLSTM:
    """The CharLSTM an exported char_lstm ONNX file computes (its weights read back)."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    values = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    lstms = [node for node in graph.node if node.op_type == "LSTM"]
    model = CharLSTM()
    if len(lstms) != model.lstm.num_layers:
        raise ValueError(f"{path}: {len(lstms)} LSTM nodes, CharLSTM has {model.lstm.num_layers}")
    state = model.state_dict()
    state["embed.weight"] = torch.from_numpy(values["embed.weight"].copy())
    state["head.weight"] = torch.from_numpy(values["head.weight"].copy())
    state["head.bias"] = torch.from_numpy(values["head.bias"].copy())
    for layer, node in enumerate(lstms):
        w, r, b = (values[node.input[i]][0] for i in (1, 2, 3))  # one direction
        hidden = r.shape[1]
        state[f"lstm.weight_ih_l{layer}"] = _torch_gates(w, hidden)
        state[f"lstm.weight_hh_l{layer}"] = _torch_gates(r, hidden)
        state[f"lstm.bias_ih_l{layer}"] = _torch_gates(b[: 4 * hidden], hidden)
        state[f"lstm.bias_hh_l{layer}"] = _torch_gates(b[4 * hidden :], hidden)
    model.load_state_dict(state, strict=True)
    return model.eval()


def _torch_gates(onnx_stacked: np.ndarray, hidden: int) -> torch.Tensor:
    gates = [onnx_stacked[k * hidden : (k + 1) * hidden] for k in _ONNX_GATES]
    return torch.from_numpy(np.concatenate(gates).copy())


def build_step() -> CharLSTMStep:
    """Factory for `batchserve export batchserve.zoo.char_lstm:build_step` (weights from
    ``--state-dict``: a CharLSTMStep's, e.g. of ``CharLSTMStep(from_onnx(...))``)."""
    return CharLSTMStep(CharLSTM())


@torch.no_grad()
def step_difference(model: CharLSTM, step: CharLSTMStep, characters: int = 200) -> float:
    """The largest difference between the step model fed held-out text one character at a
    time and the whole model on each prefix of it."""
    ids = torch.from_numpy(load_corpus().held_out[:characters].copy())
    h = torch.zeros(1, model.lstm.num_layers, model.lstm.hidden_size)
    c = torch.zeros_like(h)
    stepped = []
    for token in ids:
        logits, h, c = step(token.view(1, 1), h, c)
        stepped.append(logits[0])
    whole = model.all_logits(ids[None, :])[0]
    return float((torch.stack(stepped) - whole).abs().max())


def step_config(name: str, max_batch_size: int, max_queue_delay_us: int) -> str:
    """The config of an exported CharLSTMStep for the sequence batcher: clients send one
    ``token`` a request and get ``next_char_logits``; h and c are implicit state, zeros at
    the sequence's START."""
    state = "\n".join(
        f'  state {{ input_name: "{part}_in" output_name: "{part}_out" data_type: TYPE_FP32 '
        f"dims: [{LAYERS}, {HIDDEN}] }}"
        for part in ("h", "c")
    )
    return f"""name: "{name}"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
max_batch_size: {max_batch_size}
input {{
  name: "token"
  data_type: TYPE_INT64
  dims: [1]
}}
output {{
  name: "next_char_logits"
  data_type: TYPE_FP32
  dims: [{VOCAB_SIZE}]
}}
sequence_batching {{
  max_sequence_idle_microseconds: 60000000
  oldest {{
    max_candidate_sequences: {max_batch_size}
    max_queue_delay_microseconds: {max_queue_delay_us}
  }}
{state}
}}
"""


def write_generate(repository: Path, step_model: str = "char_lstm_step") -> Path:
    """``char_lstm_generate``: text generation over the step model, served by the built-in
    ``generation`` backend (decoupled: one response per character). No model file: its
    version directory only marks the version; the vocabulary maps token ids to characters."""
    directory = repository / "char_lstm_generate"
    (directory / "1").mkdir(parents=True, exist_ok=True)
    (directory / "1" / ".gitkeep").write_text("")
    symbols = [decode_id(token) for token in range(VOCAB_SIZE)]
    (directory / "vocabulary.json").write_text(json.dumps(symbols) + "\n")
    (directory / "config.pbtxt").write_text(f"""name: "char_lstm_generate"
backend: "generation"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [1] }},
  {{ name: "max_tokens" data_type: TYPE_INT32 dims: [1] optional: true }},
  {{ name: "temperature" data_type: TYPE_FP32 dims: [1] optional: true }},
  {{ name: "random_seed" data_type: TYPE_UINT64 dims: [1] optional: true }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [1] optional: true }}
]
output [{{ name: "text_output" data_type: TYPE_STRING dims: [1] }}]
parameters [
  {{ key: "step_model" value {{ string_value: "{step_model}" }} }},
  {{ key: "token_input" value {{ string_value: "token" }} }},
  {{ key: "logits_output" value {{ string_value: "next_char_logits" }} }},
  {{ key: "vocabulary" value {{ string_value: "vocabulary.json" }} }}
]
""")
    return directory

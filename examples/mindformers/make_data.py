"""Write a small synthetic MindRecord dataset that a tiny causal LM can learn.

    python examples/mindformers/make_data.py OUT_DIR [--samples 120] [--seq-length 32] [--vocab 256] [--seed 0]

Each sample is one ``input_ids`` row (int32, ``seq_length + 1`` tokens: mindformers'
causal-LM dataset shifts it into inputs and labels). A row is an arithmetic progression
``1 + (start + i * stride) % (vocab - 1)`` with a random start and a stride of 1 or 2,
so every token after the second one is predictable and the loss goes down within a few
dozen steps. Token 0 is never used: the legacy Llama masks ``pad_token_id``
(0) out of the loss. The same seed gives the same file.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

import numpy as np

STRIDES = (1, 2)
FILE_NAME = "train.mindrecord"


def make_rows(samples: int, seq_length: int = 32, vocab: int = 256, seed: int = 0) -> np.ndarray:
    """The token rows, shape ``(samples, seq_length + 1)``, int32, values in ``[1, vocab)``."""
    if samples < 1 or seq_length < 2 or vocab < 8:
        raise ValueError(f"need samples >= 1, seq_length >= 2, vocab >= 8; got {samples}, {seq_length}, {vocab}")
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, vocab - 1, size=(samples, 1))
    strides = rng.choice(np.array(STRIDES), size=(samples, 1))
    steps = np.arange(seq_length + 1)[None, :]
    return (1 + (starts + steps * strides) % (vocab - 1)).astype(np.int32)


def make_mindrecord(path: str, samples: int = 120, seq_length: int = 32, vocab: int = 256, seed: int = 0) -> str:
    """Write ``samples`` rows into ``path/train.mindrecord`` (plus its ``.db`` index).

    Args:
        path: directory to write into; created if missing. An existing file is overwritten.
        samples: number of rows.
        seq_length: model sequence length; each row holds ``seq_length + 1`` tokens.
        vocab: vocabulary size; tokens are in ``[1, vocab)``.
        seed: numpy seed; the same seed writes the same rows.

    Returns:
        The path of the MindRecord file (what ``train_dataset.data_loader.dataset_dir`` takes).

    Example:
        >>> make_mindrecord("/tmp/mfx/data", samples=8)  # doctest: +SKIP
        '/tmp/mfx/data/train.mindrecord'
    """
    from mindspore.mindrecord import FileWriter  # imported here: mindspore is slow to import

    rows = make_rows(samples, seq_length, vocab, seed)
    os.makedirs(path, exist_ok=True)
    file_name = os.path.join(os.path.abspath(path), FILE_NAME)
    writer = FileWriter(file_name, shard_num=1, overwrite=True)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "synthetic_progressions")
    writer.write_raw_data([{"input_ids": row} for row in rows])
    writer.commit()
    return file_name


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--samples", type=int, default=120)
    parser.add_argument("--seq-length", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    file_name = make_mindrecord(args.out_dir, args.samples, args.seq_length, args.vocab, args.seed)
    print(f"wrote {args.samples} rows of {args.seq_length + 1} tokens to {file_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

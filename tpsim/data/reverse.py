"""An algorithmic task a tiny GPT learns in seconds: read k random digits, then write them in reverse.

    tokens  d1 d2 … dk SEP dk … d2 d1          (SEP = 0, digits 1 … V−1)
    ids     tokens[:-1]                        [batch, seq_len]
    labels  tokens[1:], with the first k−1 set to ignore_index: the random digits cannot be predicted,
            everything from SEP on can

Prompting a trained model (``prompts``; ``python -m tpsim.generate --prompt``): the k digits then SEP, e.g.
``3,7,1,5,9,2,4,8,0`` at the demo's seq_len 16 (k = 8); the answer is the next k tokens, ``8 4 2 9 5 1 7 3``
(an odd seq_len trains k + 1 answer tokens, the last of them SEP: ask for k).

A model that has learnt nothing pays log(V−1) per digit; one that has learnt "the answer is one of the
digits I saw" pays about log(k); one that has learnt to reverse pays ~0. The loss curve shows all three.
Batches are a pure function of (seed, step): every run, every rank, every TP/DP layout sees the same data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpsim.errors import ConfigError

SEP = 0
IGNORE = -100


@dataclass(frozen=True)
class ReverseTask:
    vocab_size: int
    seq_len: int

    def __post_init__(self) -> None:
        if self.vocab_size < 3:
            raise ConfigError(f"the reverse task needs --vocab >= 3 (a separator and two digits), got {self.vocab_size}")
        if self.seq_len < 4:
            raise ConfigError(f"the reverse task needs --seq-len >= 4, got {self.seq_len}")

    @property
    def digits(self) -> int:
        return self.seq_len // 2

    def batch(self, seed: int, step: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """The global batch of ``step``: ``(ids, labels)``, int64 ``[batch_size, seq_len]``."""
        rng = np.random.default_rng([seed, step])
        k, n = self.digits, self.seq_len + 1
        d = rng.integers(1, self.vocab_size, size=(batch_size, k))
        tokens = np.full((batch_size, n), SEP, dtype=np.int64)
        tokens[:, :k] = d
        tail = d[:, ::-1][:, : n - k - 1]  # an odd seq_len leaves one trailing SEP
        tokens[:, k + 1:k + 1 + tail.shape[1]] = tail
        ids, labels = tokens[:, :-1].copy(), tokens[:, 1:].copy()
        labels[:, : k - 1] = IGNORE
        return ids, labels

    def prompts(self, seed: int, step: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``(prompts [count, k+1], answers [count, k])`` from ``step``'s batch: the digits then SEP, and the
        digits reversed — what a trained model should generate greedily after the prompt."""
        ids, _ = self.batch(seed, step, count)
        k = self.digits
        return ids[:, :k + 1].copy(), ids[:, :k][:, ::-1].copy()

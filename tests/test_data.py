import numpy as np
import pytest

from tpsim.errors import ConfigError
from tpsim.data import ReverseTask
from tpsim.data.reverse import IGNORE, SEP


@pytest.mark.parametrize("seq_len", [4, 9, 16])
def test_reverse_task_layout(seq_len):
    task = ReverseTask(vocab_size=10, seq_len=seq_len)
    ids, labels = task.batch(seed=1, step=0, batch_size=5)
    assert ids.shape == labels.shape == (5, seq_len) and ids.dtype == np.int64
    k = seq_len // 2
    for row_ids, row_labels in zip(ids, labels):
        digits = row_ids[:k]
        assert np.all((digits >= 1) & (digits < 10)) and row_ids[k] == SEP
        assert np.all(row_labels[:k - 1] == IGNORE) and row_labels[k - 1] == SEP
        answer = row_labels[k:]
        n = min(k, answer.size)
        assert np.array_equal(answer[:n], digits[::-1][:n])
        assert np.array_equal(row_labels[k - 1:-1], row_ids[k:]), "labels are the next token"


def test_reverse_task_is_a_pure_function_of_seed_and_step():
    t = ReverseTask(10, 8)
    a, b, c = t.batch(3, 5, 4), t.batch(3, 5, 4), t.batch(3, 6, 4)
    assert np.array_equal(a[0], b[0]) and not np.array_equal(a[0], c[0])


def test_reverse_task_rejects_tiny_configs():
    with pytest.raises(ConfigError, match="--vocab >= 3"):
        ReverseTask(2, 8)
    with pytest.raises(ConfigError, match="--seq-len >= 4"):
        ReverseTask(10, 3)

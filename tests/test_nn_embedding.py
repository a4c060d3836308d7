"""Embedding: lookup forward, scatter-add backward (repeated ids accumulate), and loud out-of-range ids."""

import numpy as np
import pytest

from tpsim.nn import Embedding, check_module_grads

TOL = 1e-7


def test_embedding_forward_is_row_lookup():
    emb = Embedding(11, 17, rng=np.random.default_rng(0))
    ids = np.random.default_rng(1).integers(0, 11, size=(2, 3, 5))
    y, cache = emb.forward(ids)
    assert y.shape == (2, 3, 5, 17)
    assert np.array_equal(y[1, 2, 4], emb.params["weight"][ids[1, 2, 4]])
    assert np.array_equal(cache, ids)


def test_embedding_repeated_ids_accumulate():
    emb = Embedding(11, 17)
    ids = np.array([[3, 3, 5], [3, 0, 5]])
    dout = np.random.default_rng(2).standard_normal((2, 3, 17))
    _, cache = emb.forward(ids)
    assert emb.backward(dout, cache) is None, "ids have no gradient"
    expected = np.zeros((11, 17))
    for pos in np.ndindex(ids.shape):
        expected[ids[pos]] += dout[pos]
    diff = np.abs(emb.grads["weight"] - expected).max()
    assert diff < 1e-14, f"scatter-add max diff {diff:.3e} (id 3 appears three times)"
    assert not emb.grads["weight"][[1, 2, 4, 6]].any(), "rows never looked up must get zero grad"


def test_embedding_weight_grad_matches_finite_differences():
    emb = Embedding(11, 17, rng=np.random.default_rng(3))
    ids = np.random.default_rng(4).integers(0, 11, size=(2, 3, 5))
    errors = check_module_grads(emb, ids)
    assert set(errors) == {"weight"}, "integer ids must be skipped; only the weight has a gradient"
    assert errors["weight"] < TOL, f"weight max relative error {errors['weight']:.3e}"


@pytest.mark.parametrize("bad", [11, -1, 100])
def test_embedding_out_of_range_ids_raise(bad):
    emb = Embedding(11, 17)
    with pytest.raises(IndexError, match=r"\[0, 11\)"):
        emb.forward(np.array([0, bad, 2]))


def test_embedding_rejects_float_ids_and_copies_master_weight():
    with pytest.raises(TypeError, match="integer"):
        Embedding(11, 17).forward(np.array([1.0, 2.0]))
    master = np.random.default_rng(5).standard_normal((11, 17))
    emb = Embedding(11, 17, weight=master)
    emb.params["weight"][0, 0] += 1.0
    assert emb.params["weight"][0, 0] != master[0, 0], "Embedding must copy the master weight"
    with pytest.raises(ValueError, match="shape"):
        Embedding(11, 16, weight=master)

"""Exercise 11b (harder) — predict the bytes, then run (lesson 11_reading_a_trace.py).

Before you look at a trace, say what it will hold. For one forward and backward of tpsim's GPT (GPT-2's
layers: a vocab-parallel embedding, n_layer blocks of attention and MLP, the loss, the LM head tied to the
embedding), tensor-parallel over ``tp`` ranks with no data parallelism and no sequence parallelism, predict
per layer the logical bytes of this rank's collectives and the bytes it sends under the ring. The check then
runs the step on real ranks and compares your numbers with the trace, layer by layer — the layer names are
those of the trace's per-layer table (``tpsim.trace.aggregate.layer_of``): ``transformer.wte``,
``transformer.h.0.attn``, ``transformer.h.0.mlp``, …, ``loss``, ``lm_head``.

Check it:   tpsim check 11b          (8 ranks, as lesson 11: real traced steps at tp 4, 2 and 1)
Stuck?      tpsim check 11b --hint   (one hint more each time)
The reference answer: tpsim lesson solution 11b (prints where it is) — try first.
"""

from __future__ import annotations


def predict_layer_bytes(tp: int, b: int, s: int, h: int, vocab: int, n_layer: int,
                        itemsize: int) -> dict[str, tuple[int, int]]:
    """``{layer: (logical bytes, wire bytes)}`` of one rank's collectives in one forward + backward.

    ``b`` sequences of ``s`` tokens, hidden size ``h``, ``vocab`` token ids, ``itemsize`` bytes per element of
    the activations (8 for float64, 4 for float32). Only layers that issue collectives appear (tpsim issues
    the TP collectives even at tp = 1, where they send nothing). Sums over the layer's calls; whole bytes.
    """
    # TODO: which collectives each layer issues, forward and backward, and of which tensor; then the ring.
    raise NotImplementedError

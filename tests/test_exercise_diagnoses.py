"""Every named learner mistake, fed to ``tpsim check``: the diagnosis says what the result looks like, not the answer.

Each case is a small wrong implementation (the reference solution with one function redefined), written to a
temporary file and checked on real ranks like a learner's. The test asserts the specific symptom sentence
appears, that no hint is printed unasked, and that the answer (the hint levels, the expected columns) is not.
Then ``--hint`` reveals the hints one level at a time, remembered in ``tpsim-out/hints.json``.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from tpsim.cli import main as tpsim_main
from tpsim.teach.checks import CHECKS
from tpsim.teach.diagnose import ranges
from tpsim.teach.lessons import exercise_files
from tpsim.tp import head_columns

pytestmark = pytest.mark.slow

SOLUTIONS = exercise_files("solutions")

# (exercise, the redefined function(s), a sentence the diagnosis must contain)
MISTAKES = {
    "f_and_g_swapped": ("02", """
        def f_backward(dy, group):
            return dy
        def g_backward(dy, group):
            return group.all_reduce(dy)
        """, "your result is the sum of dy over the 2 ranks: 2 × the gradient that every rank already holds whole"),
    "f_backward_without_all_reduce": ("02", """
        def f_backward(dy, group):
            return dy
        """, "your result is each rank's own partial sum, not the group's"),
    "row_parallel_bias_before_the_sum": ("03", """
        def row_parallel_forward(y_shard, weight_shard, bias, group):
            return group.all_reduce(y_shard @ weight_shard + bias)
        """, "the bias counted 4 times: added on every rank before the ranks' sum"),
    "mlp_forward_without_g": ("04", """
        def parallel_mlp_forward(x, fc_weight, fc_bias, proj_weight, proj_bias, group):
            a, _ = gelu_forward(linear_forward(x, fc_weight, fc_bias)[0])
            return a @ proj_weight + proj_bias
        """, "your result is each rank's own partial sum, not the group's"),
    "qkv_right_columns_wrong_order": ("05", """
        def qkv_columns(hidden, heads, tp, tp_rank):
            hd, per = hidden // heads, heads // tp
            heads_mine = range(tp_rank * per, (tp_rank + 1) * per)
            return np.concatenate([np.arange(part * hidden + j * hd, part * hidden + (j + 1) * hd)
                                   for j in heads_mine for part in range(3)])  # q_j k_j v_j, head by head
        """, "the right columns in the wrong order"),
    "qkv_contiguous_block": ("05", """
        def qkv_columns(hidden, heads, tp, tp_rank):
            width = 3 * hidden // tp
            return np.arange(tp_rank * width, (tp_rank + 1) * width)
        """, "a contiguous block of c_attn's 3·hidden columns"),
    "qkv_megatron_layout": ("05", """
        def qkv_columns(hidden, heads, tp, tp_rank):
            hd, per = hidden // heads, heads // tp
            return np.arange(tp_rank * per * 3 * hd, (tp_rank + 1) * per * 3 * hd)
        """, "the right split if c_attn were stored interleaved per head ([heads, 3, hd], Megatron's layout)"),
    "softmax_local_max": ("06", """
        def vocab_parallel_nll(logits_local, targets, vocab_start, group):
            m = logits_local.max(axis=1)  # this rank's max only
            s = group.all_reduce(np.exp(logits_local - m[:, None]).sum(axis=1))
            local = targets - vocab_start
            mine = (local >= 0) & (local < logits_local.shape[1])
            picked = np.zeros(len(targets))
            picked[mine] = logits_local[np.flatnonzero(mine), local[mine]]
            return m + np.log(s) - group.all_reduce(picked)
        """, "each rank normalised by its own maximum, not the group's"),
    "softmax_forgot_vocab_start": ("06", """
        def vocab_parallel_nll(logits_local, targets, vocab_start, group):
            m = group.all_reduce(logits_local.max(axis=1), op="max")
            s = group.all_reduce(np.exp(logits_local - m[:, None]).sum(axis=1))
            mine = targets < logits_local.shape[1]  # ids read as local columns
            picked = np.zeros(len(targets))
            picked[mine] = logits_local[np.flatnonzero(mine), targets[mine]]
            return m + np.log(s) - group.all_reduce(picked)
        """, "targets outside this rank's slice picked a logit"),
    "grad_norm_counts_replicated_on_every_rank": ("07", """
        def tp_grad_norm(entries, group):
            local = sum(float(np.sum(g * g)) for _, g, _ in entries)
            return float(np.sqrt(group.all_reduce(np.array([local]))[0]))
        """, "the replicated gradients counted once per rank, 4 times"),
    "dp_average_not_in_place": ("08", """
        def average_gradients(grads, dp_group):
            return [dp_group.all_reduce(g) / dp_group.size for g in grads]
        """, "your grads are unchanged: the result never went back into the arrays you were given"),
    "ring_bytes_are_the_logical_bytes": ("11", """
        def ring_wire_bytes(op, nbytes, p):
            return 0 if p == 1 else nbytes
        """, "your value is the logical bytes: the ring's (p − 1)/p factor is missing"),
    "kv_heads_round_robin": ("12", """
        def kv_heads_of_rank(heads, kv_heads, tp, rank):
            if kv_heads % tp == 0:
                return list(range(rank * kv_heads // tp, (rank + 1) * kv_heads // tp))
            return [rank % kv_heads]
        """, "round-robin: KV head rank % kv_heads"),
    "mlp_backward_without_f": ("04b", """
        def parallel_mlp_backward(dz, cache, group):
            da, d_proj_weight, _ = linear_backward(dz, cache.c_proj)
            dx, d_fc_weight, d_fc_bias = linear_backward(gelu_backward(da, cache.gelu), cache.c_fc)
            return dx, d_fc_weight, d_fc_bias, d_proj_weight, dz.sum(axis=0)
        """, "your result is each rank's own partial sum, not the group's"),
    "mlp_backward_all_reduces_the_replicated_bias": ("04b", """
        _right = parallel_mlp_backward
        def parallel_mlp_backward(dz, cache, group):
            out = _right(dz, cache, group)
            return (*out[:4], group.all_reduce(out[4]))
        """, "the group's sum of a gradient every rank already holds whole: 2 × too large"),
    "ce_backward_without_the_mean": ("06b", """
        _right = vocab_parallel_nll_backward
        def vocab_parallel_nll_backward(logits_local, targets, vocab_start, log_z):
            return _right(logits_local, targets, vocab_start, log_z) * len(targets)
        """, "the gradient of the summed loss, not of the mean"),
    "ce_backward_forgot_vocab_start": ("06b", """
        def vocab_parallel_nll_backward(logits_local, targets, vocab_start, log_z):
            grad = np.exp(logits_local - log_z[:, None])
            mine = targets < logits_local.shape[1]
            grad[np.flatnonzero(mine), targets[mine]] -= 1.0
            return grad / len(targets)
        """, "targets outside this rank's slice picked a logit"),
    "layout_ignores_the_budget": ("08b", """
        _right = choose_layout
        def choose_layout(config, world, batch, seq, dtype, budget_bytes):
            return _right(config, world, batch, seq, dtype, 2 ** 60)  # the cheapest, fitting or not
        """, "GiB per rank > budget"),
    "layout_ignores_the_bytes": ("08b", """
        _right = choose_layout
        def choose_layout(config, world, batch, seq, dtype, budget_bytes):
            if _right(config, world, batch, seq, dtype, budget_bytes) is None:
                return None
            for tp in (4, 2, 1):  # the largest tp that fits
                if tp * (world // tp) == world and config.n_head % tp == 0 and batch % (world // tp) == 0:
                    if sum(predict_memory(config, tp, batch // (world // tp), seq, dtype).values()) <= budget_bytes:
                        return tp, world // tp
        """, "a layout that fits sends less"),
    "predicted_wire_equals_logical": ("11b", """
        _right = predict_layer_bytes
        def predict_layer_bytes(tp, b, s, h, vocab, n_layer, itemsize):
            return {k: (v[0], v[0]) for k, v in _right(tp, b, s, h, vocab, n_layer, itemsize).items()}
        """, "your wire bytes equal the logical bytes: the ring's factor is missing"),
    "predicted_forward_only": ("11b", """
        _right = predict_layer_bytes
        def predict_layer_bytes(tp, b, s, h, vocab, n_layer, itemsize):
            out = _right(tp, b, s, h, vocab, n_layer, itemsize)
            return {k: (v[0] // 2, v[1] // 2) if ".h." in k else v for k, v in out.items()}
        """, "the backward's collectives are missing"),
    "zero1_divides_the_whole_state": ("16", """
        def model_state_bytes_per_gpu(params, dtype, zero, dp):
            weights, grads, optimizer = BYTES_PER_PARAM[dtype]
            return params * (weights + grads + optimizer) / (dp if zero else 1)
        """, "you divided the whole model state by dp: ZeRO-1 shards only the optimizer's"),
    "sp_layer_on_the_plain_tp_line": ("16", """
        _right = gpt_layer_activation_bytes
        def gpt_layer_activation_bytes(s, b, h, a, t, sp, recompute):
            return _right(s, b, h, a, t, False, recompute)
        """, "the plain-TP line under SP"),
    "predicted_the_logits_travel": ("11b", """
        _right = predict_layer_bytes
        def predict_layer_bytes(tp, b, s, h, vocab, n_layer, itemsize):
            out = _right(tp, b, s, h, vocab, n_layer, itemsize)
            out["loss"] = (b * s * vocab * itemsize, 2 * (tp - 1) * b * s * vocab * itemsize // tp)
            return out
        """, "the [tokens, V] logits never travel"),
    "argmax_of_this_rank_only": ("13", """
        def vocab_parallel_argmax(logits_local, vocab_start, vocab_size, group):
            ids = vocab_start + np.arange(logits_local.shape[-1])
            return vocab_start + np.argmax(np.where(ids < vocab_size, logits_local, -np.inf), axis=-1)
        """, "this rank's own best id: the other ranks' slices never took part"),
    "argmax_padding_wins": ("13", """
        def vocab_parallel_argmax(logits_local, vocab_start, vocab_size, group):
            j = np.argmax(logits_local, axis=-1)
            value = logits_local[np.arange(len(j)), j]
            best = group.all_reduce(value, op="max")
            return group.all_reduce(np.where(value == best, vocab_start + j, 10**9), op="min")
        """, "a padding column won"),
    "argmax_padding_masked_to_zero": ("13", """
        def vocab_parallel_argmax(logits_local, vocab_start, vocab_size, group):
            ids = vocab_start + np.arange(logits_local.shape[-1])
            real = np.where(ids < vocab_size, logits_local, 0.0)
            j = np.argmax(real, axis=-1)
            value = real[np.arange(len(j)), j]
            best = group.all_reduce(value, op="max")
            return group.all_reduce(np.where(value == best, vocab_start + j, vocab_size), op="min")
        """, "padding columns were set to 0, not −inf"),
    "argmax_ties_to_the_largest_id": ("13", """
        def vocab_parallel_argmax(logits_local, vocab_start, vocab_size, group):
            ids = vocab_start + np.arange(logits_local.shape[-1])
            real = np.where(ids < vocab_size, logits_local, -np.inf)
            j = real.shape[-1] - 1 - np.argmax(real[:, ::-1], axis=-1)
            value = real[np.arange(len(j)), j]
            best = group.all_reduce(value, op="max")
            return group.all_reduce(np.where(value == best, vocab_start + j, -1), op="max")
        """, "ties went to the largest id"),
    "zero_slices_not_padded": ("14", """
        def owned_range(n, dp, rank):
            return rank * (n // dp), (rank + 1) * (n // dp)
        """, "no padding: the slices were n // dp long"),
    "zero_pieces_in_bucket_positions": ("14", """
        def owned_pieces(sizes, dp, rank):
            lo, hi = owned_range(sum(sizes), dp, rank)
            ends = [sum(sizes[:i + 1]) for i in range(len(sizes))]
            return [(i, max(lo, e - s), min(hi, e)) for i, (s, e) in enumerate(zip(sizes, ends))
                    if max(lo, e - s) < min(hi, e)]
        """, "start and stop are positions in the bucket"),
}


def tpsim(capfd, *args: str) -> tuple[int, str]:
    capfd.readouterr()
    code = tpsim_main(list(args))
    out, err = capfd.readouterr()
    return code, out + err


def wrong_file(tmp_path, number: str, override: str):
    path = tmp_path / f"ex{number}_mine.py"
    path.write_text(SOLUTIONS[number].read_text() + "\n\n# --- the mistake ---\n" + textwrap.dedent(override))
    return path


def hint_texts(number: str) -> list[str]:
    return [level for levels in CHECKS[number].hints.values() for level in levels]


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_each_named_mistake_gets_its_diagnosis_and_not_the_answer(capfd, tmp_path, monkeypatch, case):
    number, override, diagnosis = MISTAKES[case]
    monkeypatch.chdir(tmp_path)  # no hint state of another test
    code, out = tpsim(capfd, "check", number, str(wrong_file(tmp_path, number, override)))
    assert code == 1, out
    assert f"exercise {number} FAILED" in out and diagnosis in out, out
    assert "--hint reveals" in out, out  # hints are offered ...
    assert not any(text in out for text in hint_texts(number)), out  # ... never printed unasked
    assert "expected " not in out.replace("expected shape", ""), out  # no expected value anywhere
    if number == "05":  # nor the expected columns
        answers = {ranges(head_columns(h, n, t, r)) for h, n, t in [(48, 8, 4), (64, 16, 4), (24, 6, 2)]
                   for r in range(t)}
        assert not any(a in out for a in answers), out


def test_hints_are_revealed_one_level_at_a_time_and_remembered(capfd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    number, override, _ = MISTAKES["softmax_local_max"]
    mine = str(wrong_file(tmp_path, number, override))
    levels = CHECKS[number].hints["vocab_parallel_nll"]
    assert len(levels) >= 3
    for shown in range(1, len(levels) + 1):
        code, out = tpsim(capfd, "check", number, mine, "--hint")
        assert code == 1, out
        assert "each rank normalised by its own maximum" in out  # the diagnosis comes first, always
        for level, text in enumerate(levels, start=1):
            assert (text in out) == (level <= shown), (shown, level, out)
        state = json.loads((tmp_path / "tpsim-out" / "hints.json").read_text())
        assert state == {number: {"vocab_parallel_nll": shown}}
    code, out = tpsim(capfd, "check", number, mine, "--hint")  # past the last level: stays there
    assert "that was the last level" in out and levels[-1] in out
    code, out = tpsim(capfd, "check", number, mine, "--hint", "1")  # an explicit level
    assert levels[0] in out and levels[1] not in out
    assert json.loads((tmp_path / "tpsim-out" / "hints.json").read_text())[number]["vocab_parallel_nll"] == 1


def test_hint_on_a_stub_is_about_the_function_not_done_and_a_bad_level_is_a_usage_error(capfd, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out = tpsim(capfd, "check", "04b", "--hint")
    assert code == 3 and "is not done yet" in out
    first = CHECKS["04b"].hints["parallel_mlp_backward"]
    assert first[0] in out and first[1] not in out
    with pytest.raises(SystemExit) as exc:
        tpsim_main(["check", "02", "--hint", "0"])
    assert exc.value.code == 2

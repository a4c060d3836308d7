"""The GPT demo with plausible bugs planted one at a time (mutation testing): do its own verdicts catch them?

    mpiexec -n 4 python tests/programs/demo_with_bug.py BUG[,BUG...] [demo flags...]

Each BUG is one of ``BUGS`` (``none`` plants nothing): bugs issue 13 (and issue 21: the export) found the step-0
verdict and the formula check blind to, planted by monkeypatching in this process only — tpsim's files are untouched. The demo's main
runs once per BUG in this one job (one launch instead of several: each costs seconds), the bug removed again
after its run; rank 0 prints ``BUG <name>: exit status <s>`` after each. With a bug the demo must end with a
MISMATCH verdict or a failed FORMULA CHECK and status 1; with none, status 0.
"""

import sys
from contextlib import ExitStack
from unittest import mock

from tpsim.comm.launch import run_main, world_rank


def bias_before_all_reduce():
    """RowParallelLinear adds its bias to each rank's partial sum, so the all-reduce adds it tp times."""
    from tpsim.nn.linear import linear_forward
    from tpsim.tp.row_parallel import RowParallelLinear

    original = RowParallelLinear.forward

    def forward(self, y):
        if not self.input_is_parallel or "bias" not in self.params:
            return original(self, y)
        with self.group.tracer.region(scope=self.path):
            partial, cache = linear_forward(y, self.params["weight"], self.params["bias"])  # the bug
            return self.region.leave(partial, self.group), cache

    return mock.patch.object(RowParallelLinear, "forward", forward)


def clip_counts_replicated_twice():
    """Every TP rank adds the replicated gradients (LayerNorms, row-parallel biases) to the clipping norm."""
    from tpsim.train import clip

    original = clip.local_contribution
    return mock.patch.object(clip, "local_contribution",
                             lambda entries, p, count_replicated: original(entries, p, True))


def adamw_with_l2_decay():
    """AdamW folding the weight decay into the gradient (Adam + L2) instead of decaying the weight itself."""
    from tpsim.train.optim import AdamW

    original = AdamW.update

    def update(self, p, g, state, weight_decay):
        original(self, p, g + weight_decay * p if weight_decay else g, state, 0.0)

    return mock.patch.object(AdamW, "update", update)


def wrong_wire_bytes():
    """All-reduces traced with (p−1)/p·B wire bytes (one pass of the ring) instead of 2(p−1)/p·B."""
    from tpsim.comm import group
    from tpsim.cost import wire_bytes

    return mock.patch.object(group, "wire_bytes", lambda op, nbytes, p: (
        (p - 1) * nbytes // p if op == "all_reduce" else wire_bytes(op, nbytes, p)))


def export_transposes_c_proj():
    """The export writes GPT-2's square attention projection transposed in the Hugging Face layout: every shape
    still fits, so nothing complains until the folder is read back."""
    from tpsim.hf import checkpoint

    original = checkpoint.to_hf

    def to_hf(tensors, config):
        return {n: a.T.copy() if n.endswith("attn.c_proj.weight") else a for n, a in original(tensors, config).items()}

    return mock.patch.object(checkpoint, "to_hf", to_hf)


def dloss_off_by_a_percent():
    """Every replica's backward starts from 1.01·dloss (the executor's seeds): visible at step 0, which must then
    say it differs."""
    from tpsim.live_pipeline.executor import Executor

    original = Executor.run

    def run(self, inputs, labels, plans, seeds, **kwargs):
        return original(self, inputs, labels, plans, None if seeds is None else [1.01 * s for s in seeds], **kwargs)

    return mock.patch.object(Executor, "run", run)


def zero_drops_last_owned_element():
    """ZeRO-1's last DP rank loses the last element it owns in a padded bucket (a slice off by the padding):
    invisible wherever no bucket pads, as at the demo's sizes."""
    from tpsim import partition
    from tpsim.train import zero

    original = partition.owned_segments

    def owned_segments(sizes, dp, rank):
        segments = original(sizes, dp, rank)
        if sum(sizes) % dp and rank == dp - 1 and segments:
            s = segments[-1]
            segments[-1] = partition.Segment(s.index, s.start, max(s.start, s.stop - 1), s.buffer_start)
        return segments

    return mock.patch.object(zero, "owned_segments", owned_segments)


def clip_before_unscale():
    """float16: the loss scaler only agrees on found-inf and the gradients are unscaled in ``step``, after they
    were measured and clipped — the same way in both optimizers (plain mixed precision and ZeRO-1)."""
    from importlib import import_module  # tpsim.train's mixed_precision is also a function's name

    from tpsim.train.loss_scale import found_inf_anywhere

    mixed_precision, zero = (import_module(f"tpsim.train.{m}") for m in ("mixed_precision", "zero"))

    late = []  # this step's (gradients, 1/S), unscaled only when the step runs

    def agree_only(grads, scaler, world):
        late[:] = [(list(grads), 1.0 / scaler.scale)]
        found = found_inf_anywhere(late[0][0], world)
        scaler.update(found)
        return found

    def unscaling_step(original):
        def step(self):
            for grads, inv in late:
                for g in grads:
                    g *= inv
            late.clear()
            original(self)

        return step

    stack = ExitStack()
    for module, cls in ((mixed_precision, mixed_precision.MixedPrecisionOptimizer),
                        (zero, zero.DistributedOptimizer)):
        stack.enter_context(mock.patch.object(module, "unscale_and_agree", agree_only))
        stack.enter_context(mock.patch.object(cls, "step", unscaling_step(cls.step)))
    return stack


BUGS = {"row-bias": bias_before_all_reduce, "clip-replicated": clip_counts_replicated_twice,
        "adamw-l2": adamw_with_l2_decay, "wire-bytes": wrong_wire_bytes, "clip-before-unscale": clip_before_unscale,
        "export-transposed": export_transposes_c_proj, "dloss-scaled": dloss_off_by_a_percent,
        "zero-padding": zero_drops_last_owned_element, "none": ExitStack}


def main() -> int:
    from tpsim.demo.cli import main as demo

    for name in sys.argv[1].split(","):
        with BUGS[name]():
            status = demo(sys.argv[2:])
        if world_rank() == 0:
            print(f"BUG {name}: exit status {status}", flush=True)
    return 0


run_main(main, prog="demo_with_bug")

"""Model state under ZeRO: who owns which slice of a gradient buffer, and the bytes per parameter.

Pure arithmetic (no MPI), shared by ``tpsim.train.zero``, the formulas, the demo's table and lesson 14.

**Owned slices** (Megatron's distributed optimizer, Rajbhandari et al. 2019 ZeRO stage 1, arXiv:1910.02054).
A bucket packs ``n`` gradient elements into one flat buffer, padded with zeros to a multiple of the DP size d:

    n_pad = ⌈n / d⌉ · d        DP rank r owns [r · n_pad/d, (r + 1) · n_pad/d)

A reduce-scatter hands rank r the summed gradients of exactly that range; the optimizer state exists only for
it; an all-gather of the ranges rebuilds the whole buffer. A parameter may straddle two ranks' ranges: each
updates its own piece (``owned_segments`` says which piece of which parameter).

**Bytes per parameter** (Megatron-LM's ``docs/source/api-guide/dist_optimizer.md``). Per parameter a rank
holds its model parameter and gradient (replicated over DP: every rank needs the full model) and, sharded 1/d
under the distributed optimizer, the fp32 main parameter (when the model's is 16-bit), an fp32 main gradient
(when the model's is fp16) and Adam's two fp32 moments:

    layout                       param  grad  main param  main grad  Adam m, v   plain   distributed
    fp16 params, fp16 grads        2     2        4           4         8         20     4 + 16/d
    bf16 params, fp32 grads        2     4        4           -         8         18     6 + 12/d
    fp32 params, fp32 grads        4     4        -           -         8         16     8 + 8/d

ZeRO-2 shards the model's gradient too (its owned slice only: bf16 row 2 + 16/d), ZeRO-3 the parameter as
well (18/d): ``StateLayout.bytes_per_zero_stage``; the planner's columns are the same (``tpsim.plan.zero3``).

tpsim's own float32 layout is the last row exactly (AdamW updates the model's array in place: the parameter
*is* the main parameter, and the gradient buffer's owned slice *is* the main gradient). Its float64 default
doubles each column: 32 plain, 16 + 16/d distributed. The 16-bit rows need fp32 main parameters, which only
a mixed-precision optimizer holds; ``measure_model_state`` counts whatever its ``state_bytes()`` reports.
tpsim's bfloat16 *and* float16 are the bf16 row, 18 plain and 6 + 12/d under ZeRO-1: a 16-bit parameter's
gradient is its float32 main gradient (no 16-bit gradient copy, so no fp16 row's 20 → 4 + 16/d), and the
distributed optimizer keeps the float32 main parameters and AdamW's m, v for its owned slices only.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from tpsim.nn.module import held_nbytes
from tpsim.partition import padded_length
from tpsim.zero_stage import zero_stage

# --- owned slices ----------------------------------------------------------------------------------------------


def zero_buffer_elements(bucket_elements: list[int], dp: int) -> int:
    """Elements of all the padded buckets: what each rank reduce-scatters and all-gathers per step."""
    return sum(padded_length(n, dp) for n in bucket_elements)


def zero_optimizer_bytes(bucket_elements: list[int], dp: int, itemsize: int, slots: int = 2,
                         main_param_bytes: int = 0) -> int:
    """Optimizer-state bytes one DP rank holds under ZeRO-1: ``slots`` arrays of ``itemsize`` (the gradient
    buckets' dtype: float32 under mixed precision) over its owned slices, padding included as the live arrays
    are, plus ``main_param_bytes`` per element for a 16-bit model's float32 main parameters (4; else 0).
    AdamW has 2 slots, SGD with momentum 1: a bf16/fp16 model with AdamW holds (2·4 + 4)·n_pad/d = 12 n_pad/d."""
    return (slots * itemsize + main_param_bytes) * zero_buffer_elements(bucket_elements, dp) // dp


# --- bytes per parameter ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StateLayout:
    """Bytes per parameter of each piece of model state (0 = not held)."""

    name: str
    param: int
    grad: int
    main_param: int
    main_grad: int
    optimizer: int

    @property
    def replicated(self) -> int:
        """Bytes every DP rank keeps whole: the model's parameter and gradient."""
        return self.param + self.grad

    @property
    def sharded(self) -> int:
        """Bytes the distributed optimizer splits over DP: main parameter, main gradient, optimizer state."""
        return self.main_param + self.main_grad + self.optimizer

    def bytes_per_parameter(self, dp: int = 1, distributed: bool = False) -> Fraction:
        """replicated + sharded, with the sharded part ÷ dp when ``distributed`` (exact, as a Fraction)."""
        return self.replicated + Fraction(self.sharded, dp if distributed else 1)

    def zero_split(self, zero: int) -> tuple[int, int]:
        """``(kept whole, sharded over d)`` bytes per parameter at ZeRO stage ``zero`` (Rajbhandari et al. 2019
        §5): 1 shards the main copies and the optimizer, 2 the model's gradient too, 3 its parameter as well."""
        stage = zero_stage(zero)
        whole = (0 if stage.shards_params else self.param) + (0 if stage.shards_grads else self.grad) \
            + (0 if stage.shards_optimizer else self.sharded)
        return whole, self.replicated + self.sharded - whole

    def bytes_per_zero_stage(self, zero: int, dp: int) -> Fraction:
        """Bytes per parameter one of ``dp`` ranks holds at ZeRO ``zero``: whole + sharded/dp, exactly."""
        whole, sharded = self.zero_split(zero)
        return whole + Fraction(sharded, dp)


MEGATRON_LAYOUTS = (  # dist_optimizer.md's three rows
    StateLayout("fp16 params, fp16 grads", 2, 2, 4, 4, 8),
    StateLayout("bf16 params, fp32 grads", 2, 4, 4, 0, 8),
    StateLayout("fp32 params, fp32 grads", 4, 4, 0, 0, 8),
)
TPSIM_FLOAT64 = StateLayout("tpsim float64 (AdamW in place)", 8, 8, 0, 0, 16)
# tpsim's 16-bit mixed precision (tpsim.train.mixed_precision): a 16-bit parameter's gradient *is* its float32 main
# gradient (no 16-bit gradient copy), float32 main parameters and AdamW state — Megatron's bf16 row, for float16 too
# (Megatron's fp16 row keeps a 16-bit gradient and a separate float32 main gradient: 20 bytes, not 18).
TPSIM_16BIT = StateLayout("tpsim 16-bit (fp32 main grads)", 2, 4, 4, 0, 8)


def format_formula(layout: StateLayout, zero: int = 1) -> str:
    """``"4 + 16/d"``: the distributed column the way Megatron writes it (ZeRO-1; ``zero`` 2: ``"2 + 18/d"``,
    3: ``"20/d"``)."""
    whole, sharded = layout.zero_split(zero)
    return f"{whole} + {sharded}/d" if whole and sharded else f"{sharded}/d" if sharded else str(whole)


# --- measured from live arrays ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelState:
    """Model-state bytes on one rank and the parameters they serve (the full model's, not this rank's shard)."""

    params: int
    grads: int
    optimizer: int
    parameters: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def per_parameter(self) -> dict[str, Fraction]:
        """Bytes ÷ parameters for each part and in total, exactly."""
        n = self.parameters
        return {"params": Fraction(self.params, n), "grads": Fraction(self.grads, n),
                "optimizer": Fraction(self.optimizer, n), "total": Fraction(self.total, n)}


def measure_model_state(model, optimizer, parameters: int | None = None) -> ModelState:
    """Bytes of ``model``'s parameter and gradient arrays (each tied array once; ZeRO-2's placeholders hold none,
    its owned slices are ``optimizer.grad_bytes()``) and ``optimizer.state_bytes()``
    (any dtype: a mixed-precision optimizer counts its fp32 main parameters and gradients there).

    ``parameters`` defaults to the elements of this rank's parameters; under ZeRO-1 with TP 1 the model is
    whole on each rank, so bytes ÷ parameters is the table's per-parameter figure.
    """
    params = sum(held_nbytes(p) for _, p in model.named_parameters())
    params += optimizer.param_bytes() if optimizer is not None else 0  # ZeRO-3's owned slices
    grads = sum(held_nbytes(g) for _, g in model.named_grads())
    grads += optimizer.grad_bytes() if optimizer is not None else 0  # ZeRO-2's owned slices
    count = sum(p.size for _, p in model.named_parameters()) if parameters is None else parameters
    return ModelState(params, grads, optimizer.state_bytes() if optimizer is not None else 0, count)


def layout_for(itemsize: int) -> StateLayout:
    """tpsim's own layout for a model of ``itemsize``-byte floats with AdamW (float32/float64: no main copies,
    updated in place; 16-bit: mixed precision's float32 main gradients and parameters)."""
    if itemsize == 4:
        return MEGATRON_LAYOUTS[2]
    if itemsize == 8:
        return TPSIM_FLOAT64
    if itemsize == 2:
        return TPSIM_16BIT
    raise ValueError(f"no tpsim layout for {itemsize}-byte parameters")


def _fraction(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{float(x):.3f}"


def format_model_state(measured: ModelState, layout: StateLayout, dp: int, zero: int, optimizer_formula: int,
                       title: str = "", grads_formula: int | None = None, params_formula: int | None = None) -> str:
    """Measured bytes ÷ parameters beside the layout's formula at ZeRO stage ``zero`` (0: a plain optimizer);
    with a distributed optimizer, Megatron's three rows at this d and stage (without one every row is its plain
    count, so the table would say nothing: one line says so).

    ``optimizer_formula``: the predicted optimizer bytes of this rank (padding included), checked exactly;
    ``grads_formula`` (ZeRO-2: the owned slices' bytes), when given, checks the gradients the same way;
    ``params_formula`` (ZeRO-3) the parameters.
    """
    from tpsim.table import RULE, format_table  # pure text

    per = measured.per_parameter()
    stage = zero_stage(zero)
    shard = {"params": stage.shards_params, "grads": stage.shards_grads, "optimizer": stage.shards_optimizer}
    whole = {"params": layout.param, "grads": layout.grad, "optimizer": layout.sharded}
    formula = {k: Fraction(v, dp if shard[k] else 1) for k, v in whole.items()}
    formula["total"] = layout.bytes_per_zero_stage(zero, dp)
    exact = {"optimizer": optimizer_formula, "grads": grads_formula, "params": params_formula}
    rows = [["", "bytes", "per parameter", "formula", "check"], RULE]
    for key in ("params", "grads", "optimizer", "total"):
        value, want = getattr(measured, key), exact.get(key)
        check = "" if want is None else "ok" if value == want else "DIFFERS"
        rows.append([key, f"{value:,}", _fraction(per[key]), _fraction(formula[key]), check])
    checked = ("parameter, gradient and optimizer columns add" if params_formula is not None
               else "optimizer and gradient columns add" if grads_formula is not None else "optimizer column adds")
    distributed = stage.shards_optimizer
    said = format_formula(layout, zero) if distributed else layout.replicated + layout.sharded
    lines = [format_table(rows, title=title),
             f"  formula: {layout.name}, {said}{' at d = ' + str(dp) if distributed else ' (plain optimizer)'}; "
             f"the measured {checked} only the padding of the buckets, if any"]
    if not distributed:
        return "\n".join(lines + ["  Megatron's table (dist_optimizer.md) shards the optimizer state over d DP ranks: "
                                  "--zero 1 shows it at this d (--zero 2 the gradients too)"])
    lines.append(f"  Megatron's table (dist_optimizer.md), bytes per parameter, plain -> ZeRO-{zero} at d = {dp}:")
    values = [row.bytes_per_zero_stage(zero, dp) for row in MEGATRON_LAYOUTS]
    for row, value in zip(MEGATRON_LAYOUTS, values):
        lines.append(f"    {row.name:<24} {_fraction(row.bytes_per_parameter()):>3} -> "
                     f"{format_formula(row, zero):<9} = {_fraction(value)}")
    if len(set(values)) == 1:  # d = 2 at ZeRO-1: each layout's replicated bytes make up for what it shards
        apart = " / ".join(f"{float(row.bytes_per_zero_stage(zero, 8)):g}" for row in MEGATRON_LAYOUTS)
        lines.append(f"    (all three come to {_fraction(values[0])} at d = {dp}: the layouts that keep more "
                     f"replicated shard less; at d = 8 they part, {apart})")
    return "\n".join(lines)

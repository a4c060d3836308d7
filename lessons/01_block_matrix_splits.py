# %% [markdown]
# # Lesson 01 — Two ways to split a matrix product
#
# Runs on **1 rank**: `mpirun -n 1 python lessons/01_block_matrix_splits.py` (or `tpsim lesson run 01`;
# as a notebook on as many engines: `tpsim lesson notebook 01`).
#
# Tensor parallelism spreads one layer's weights over several devices so that each device stores and multiplies
# only a slice. Whether that works without drowning in communication comes down to two facts about block
# matrices, equations (1) and (2) of the SenseParrots article on model parallelism that these lessons follow
# (README.md, "Sources"). This lesson checks them in plain NumPy, on one process, before any rank talks to
# another; every later lesson runs them on real ranks.
#
# Shapes follow the code base: activations are `[tokens, features]` and a weight is `[in, out]`, so a linear
# layer is `y = x · W`.
#
# Sources: the SenseParrots article, eqs. (1) and (2); Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, §3.

# %%
RANKS = 1

import numpy as np

from tpsim.teach.runtime import Lesson

lesson = Lesson("01", RANKS)
rng = np.random.default_rng(0)

# %% [markdown]
# ## Equation (1): split the weight by columns
#
# Cut `A: [in, out]` into column blocks `A = [A1 A2]`. Column j of `X·A` is `X` times column j of `A` and
# nothing else, so
#
#     X · [A1 A2] = [X·A1  X·A2]                                                    (1)
#
# A device that holds `A1` and the *whole* input `X` computes the first block of the output columns by itself.
# The devices need the same input and produce disjoint slices of the output: no sum is needed, and the slices
# can simply stay where they are if the next layer is happy with a split input. Sizes are deliberately awkward
# (13 tokens, 7 inputs, 10 outputs), so that nothing works by accident.

# %%
X = rng.standard_normal((13, 7))
A = rng.standard_normal((7, 10))
A1, A2 = A[:, :6], A[:, 6:]  # blocks need not be equal; in a real layer they are (out / p each)

lesson.section("Equation (1): split the weight by columns")
lesson.expect("rounding-level agreement: column j of X·A depends on column j of A only")
Y_blocks = np.concatenate([X @ A1, X @ A2], axis=1)
lesson.close("eq. (1): max |[X·A1  X·A2] − X·A|", Y_blocks, X @ A)
lesson.expect("each block keeps all 13 rows (tokens) and only its own output columns, 6 and 4")
lesson.equal("shapes of X·A1 and X·A2 (tokens × a slice of the outputs)", ((X @ A1).shape, (X @ A2).shape),
             ((13, 6), (13, 4)))

# %% [markdown]
# ## Equation (2): split the weight by rows
#
# Now cut `B: [in, out]` into row blocks `B = [B1; B2]` and the input's columns the same way, `Y = [Y1 Y2]`.
# Entry (i, j) of `Y·B` is a sum over the inner index; splitting that index into two ranges splits the sum:
#
#     [Y1 Y2] · [B1; B2] = Y1·B1 + Y2·B2                                             (2)
#
# A device that holds `B1` needs only *its* columns `Y1` of the input, and produces a full-size output that is
# only part of the answer. The partial results must be **added**: that is the all-reduce of tensor
# parallelism.

# %%
Y = rng.standard_normal((13, 10))
B = rng.standard_normal((10, 5))
Y1, Y2, B1, B2 = Y[:, :6], Y[:, 6:], B[:6], B[6:]

partials = [Y1 @ B1, Y2 @ B2]
lesson.section("Equation (2): split the weight by rows")
lesson.expect("the two partial products add up to Y·B: the inner sum split into two ranges")
lesson.close("eq. (2): max |Y1·B1 + Y2·B2 − Y·B|", partials[0] + partials[1], Y @ B)
lesson.expect("a large difference: one partial product is only half of the sum")
lesson.apart("one partial product alone is not the answer: max |Y1·B1 − Y·B|", partials[0], Y @ B, 0.1)

# %% [markdown]
# ## Chaining them: the output of (1) is the input of (2)
#
# Put the two side by side. A device holding the column block `A_i` produces `X·A_i`, which is *exactly* the
# column block `Y_i` of `Y = X·A` that equation (2) asks for when `B` is split into the matching rows `B_i`:
#
#     (X·A)·B = Σ_i (X·A_i)·B_i
#
# So two layers in a row need a single sum at the very end and nothing in between — no gathering of `Y`, no
# re-splitting. This is the whole trick of Megatron's MLP (lesson 04); here it is with four blocks.

# %%
p = 4
A4 = rng.standard_normal((7, 12))  # 12 columns: 3 per block
B4 = rng.standard_normal((12, 5))
A_blocks = np.split(A4, p, axis=1)
B_blocks = np.split(B4, p, axis=0)
lesson.section("Chaining them: the output of (1) is the input of (2)")
lesson.expect("one sum at the very end is enough: (X·A_i) is exactly the column block that B_i needs")
chained = sum((X @ A_i) @ B_i for A_i, B_i in zip(A_blocks, B_blocks))
lesson.close(f"chain with {p} blocks: max |Σ_i (X·A_i)·B_i − (X·A)·B|", chained, (X @ A4) @ B4)

# %% [markdown]
# ## Each block does 1/p of the work
#
# Multiplying `[m, k]` by `[k, n]` costs `2·m·k·n` floating-point operations (a multiply and an add per term).
# Splitting `A` by columns or `B` by rows divides `n` or `k` by p, so each device does exactly 1/p of the work
# — and stores 1/p of the weight, which is the point when the weight does not fit on one device.

# %%
def flops(m: int, k: int, n: int) -> int:
    return 2 * m * k * n


lesson.section("Each block does 1/p of the work")
lesson.expect("the 4 blocks' FLOPs add up to the whole product's, and each stores a quarter of A")
whole = flops(13, 7, 12)
per_block = [flops(13, 7, A_i.shape[1]) for A_i in A_blocks]
lesson.equal("FLOPs of the 4 column blocks add up to the whole product", sum(per_block), whole)
lesson.equal("weight elements stored per device (A split 4 ways)", A_blocks[0].size, A4.size // p)

# %% [markdown]
# ## Where the split stops being free: a nonlinearity
#
# A layer is followed by an element-wise nonlinearity φ (GeLU in GPT). Element-wise functions respect a
# *column* split — applying φ to each block is applying it to the whole:
#
#     φ([X·A1  X·A2]) = [φ(X·A1)  φ(X·A2)]
#
# but they do not respect a *sum*: φ(Y1·B1 + Y2·B2) ≠ φ(Y1·B1) + φ(Y2·B2). After a row split, the partial
# results must be added *before* φ, which costs a synchronisation right there. That asymmetry decides which
# layer of the MLP gets which split (lesson 04). Here φ = tanh, written out in NumPy.

# %%
lesson.section("Where the split stops being free: a nonlinearity")
phi = np.tanh
lesson.expect("φ commutes with the column split (rounding-level difference) ...")
lesson.close("φ respects the column split: max |[φ(X·A1) φ(X·A2)] − φ(X·A)|",
             np.concatenate([phi(X @ A_i) for A_i in A_blocks], axis=1), phi(X @ A4))
lesson.expect("... but not with a sum: a large difference")
lesson.apart("φ does not respect the sum: max |φ(Y1·B1) + φ(Y2·B2) − φ(Y·B)|",
             phi(partials[0]) + phi(partials[1]), phi(Y @ B), 0.1)

# %% [markdown]
# ## A picture of the two splits
#
# The figure colours every block by the device that holds it: on the left, equation (1) — the whole `X`, one
# column block of `A` each, one column block of the output each; on the right, equation (2) — one column block
# of `Y` and one row block of `B` each, and a full-size partial output each, to be summed.

# %%
lesson.section("A picture of the two splits")
if lesson.rank == 0:
    plt = lesson.pyplot()
    from matplotlib.colors import ListedColormap

    cmap = ListedColormap(["#DDDDDD", "#4C72B0", "#DD8452"])  # grey = everyone, blue = device 1, orange = 2

    def owner(rows: int, cols: int, split: str | None) -> np.ndarray:
        grid = np.zeros((rows, cols))
        if split == "cols":
            grid[:, cols // 2:], grid[:, :cols // 2] = 2, 1
        elif split == "rows":
            grid[rows // 2:], grid[:rows // 2] = 2, 1
        return grid

    panels = [("X (everyone)", owner(6, 4, None)), ("A = [A1 A2]", owner(4, 6, "cols")),
              ("X·A = [X·A1 X·A2]", owner(6, 6, "cols")), ("Y = [Y1 Y2]", owner(6, 6, "cols")),
              ("B = [B1; B2]", owner(6, 4, "rows")), ("Y1·B1 + Y2·B2 (summed)", owner(6, 4, None))]
    fig, axes = plt.subplots(1, 6, figsize=(13, 2.6))
    for ax, (title, grid) in zip(axes, panels):
        ax.imshow(grid, cmap=cmap, vmin=0, vmax=2)
        ax.set_title(title, fontsize=9)
        ax.set_xticks([]), ax.set_yticks([])
    fig.suptitle("eq. (1): split A by columns (left three)    eq. (2): split B by rows (right three)\n"
                 "blue: device 1   orange: device 2   grey: every device holds all of it", fontsize=10)
    fig.tight_layout()
    lesson.save(fig, "01_block_splits.png")

# %% [markdown]
# ## What to take away
#
# * Column split (1): same input everywhere, disjoint output slices, no communication.
# * Row split (2): split input, full-size partial outputs that must be summed — one all-reduce.
# * Column then row: the split output of (1) is the split input of (2), so the pair needs one sum at the end.
# * Element-wise functions commute with a column split, not with a sum.
#
# Exercise: `ex01_block_matrix_splits.py`: `tpsim lesson start 01` copies it into your work folder (`tpsim-work/`),
# then `tpsim check 01`.

# %%
lesson.takeaways()
lesson.finish()

"""Which layers each pipeline stage holds: an even split, or the sizes ``--pp-layers a,b,...`` give.

A model of L transformer layers is cut into ``stages = pp × vp`` consecutive pieces (virtual stages; chunk c of
pipeline rank r is virtual stage c·pp + r, ``tpsim.pipeline.actions``). Virtual stage 0 also holds the
embedding, the last one the final norm, the LM head and the loss. Even: L / stages layers each (Megatron's
rule without uneven stages); uneven: the sizes given, e.g. Llama-3 405B's one layer fewer on the first and last
stage. Every stage holds at least one layer. Pure arithmetic, no MPI: the configuration checks it on every rank
before any work, and a layout it refuses is one line.

    split_layers(6, 3)              -> (range(0, 2), range(2, 4), range(4, 6))
    split_layers(6, 2, (2, 4))      -> (range(0, 2), range(2, 6))
    split_layers(8, 4, vp=2)        -> four virtual stages of 2 layers (pp 2 × vp 2)
"""

from __future__ import annotations

from tpsim.errors import ConfigError


def parse_stage_layers(text: str | None) -> tuple[int, ...] | None:
    """``"2,3,3"`` -> ``(2, 3, 3)`` (``--pp-layers``); None stays None; ConfigError for anything else."""
    if text is None:
        return None
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(f"--pp-layers {text!r}: give the layers of every stage as integers, e.g. 2,3,3") from None
    return sizes


def split_layers(layers: int, stages: int, sizes: tuple[int, ...] | None = None, *, vp: int = 1) -> tuple[range, ...]:
    """The layer range of every virtual stage, in stage order; ``ConfigError`` (one line) for a layout that
    cannot be: more stages than layers, an even split that does not divide, sizes of the wrong count or sum.
    ``vp``: the model chunks per rank ``stages`` counts (pp × vp), so a message can say so."""
    if stages < 1:
        raise ConfigError(f"a pipeline needs at least one stage, got {stages}")
    times = "" if vp == 1 else f" (--pp {stages // vp} x --vp {vp})"
    what = f"{stages} {'pipeline' if vp == 1 else 'virtual'} stages{times}"
    if sizes is None:
        if stages > layers:
            raise ConfigError(f"{what} for {layers} layer{'s' * (layers != 1)}: every stage needs at least one "
                              "layer")
        if layers % stages:
            raise ConfigError(f"--layers {layers} do not split evenly over {what}: give --pp-layers with "
                              f"{stages} sizes summing to {layers}")
        sizes = (layers // stages,) * stages
    given = ",".join(map(str, sizes))
    if len(sizes) != stages:
        raise ConfigError(f"--pp-layers {given} names {len(sizes)} stages, the pipeline has "
                          f"{what if vp > 1 else stages}")
    if min(sizes) < 1:
        raise ConfigError(f"--pp-layers {given}: every stage needs at least one layer")
    if sum(sizes) != layers:
        raise ConfigError(f"--pp-layers {given} sums to {sum(sizes)}, the model has {layers} layers")
    starts = [sum(sizes[:i]) for i in range(stages)]
    return tuple(range(a, a + n) for a, n in zip(starts, sizes))

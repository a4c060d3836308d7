"""Layers decide once: no forward or backward in ``tpsim.tp`` or ``tpsim.models`` asks whether it runs
sequence-parallel.

The pair (f, g) or (f̄, ḡ) is a region object given to a layer when it is built (``tpsim.tp.regions``); the
layer calls it — and so does the model's edge, where the embedding's output is split along the sequence
(``Transformer``'s ``region.split_sequence``). This reads the source of every ``forward``/``backward`` in
``tpsim/tp/`` and ``tpsim/models/`` and fails on any mention of the switch or of a particular region (the region
classes themselves are the two answers); the builders, which choose the region, are free to.
"""

import ast
from pathlib import Path

import tpsim.tp

TP = Path(tpsim.tp.__file__).parent
MODELS = TP.parent / "models"
FORBIDDEN = ("sequence_parallel", "splits_sequence", "SP_REGION", "TP_REGION", "SequenceParallelRegion", "sp_group")


def test_no_forward_or_backward_in_tp_branches_on_the_region():
    offenders = []
    for path in sorted([*TP.glob("*.py"), *MODELS.glob("*.py")]):
        if path.name == "regions.py":
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and node.name in ("forward", "backward"):
                body = ast.get_source_segment(source, node)
                offenders += [f"{path.name}:{node.lineno} {node.name} mentions {word}"
                              for word in FORBIDDEN if word in body]
    assert not offenders, "\n".join(offenders)

"""Layers decide once: no forward or backward in ``tpsim.tp`` asks whether it runs sequence-parallel.

The pair (f, g) or (f̄, ḡ) is a region object given to a layer when it is built (``tpsim.tp.regions``); the
layer calls it. This reads the source of every ``forward``/``backward`` in ``tpsim/tp/`` and fails on any
mention of the switch or of a particular region (the region classes themselves are the two answers).
"""

import ast
from pathlib import Path

import tpsim.tp

TP = Path(tpsim.tp.__file__).parent
FORBIDDEN = ("sequence_parallel", "splits_sequence", "SP_REGION", "TP_REGION", "SequenceParallelRegion")


def test_no_forward_or_backward_in_tp_branches_on_the_region():
    offenders = []
    for path in sorted(TP.glob("*.py")):
        if path.name == "regions.py":
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and node.name in ("forward", "backward"):
                body = ast.get_source_segment(source, node)
                offenders += [f"{path.name}:{node.lineno} {node.name} mentions {word}"
                              for word in FORBIDDEN if word in body]
    assert not offenders, "\n".join(offenders)

"""One check per exercise: the learner's function against tpsim's own layers, on real ranks, random inputs.

    registry        ``@exercise(...)`` and ``CHECKS``, the registry ``tpsim check`` reads
    lessons_01_05   the exercises of lessons 01–05 (block splits, f and g, row-parallel, MLP, qkv columns)
    lessons_06_11   the exercises of lessons 06–11 (parallel softmax, grad norm, DP average, SP, ring bytes)
    backward        the harder backward exercises: 04b (the parallel MLP), 06b (the vocab-parallel CE)
    planning        the harder planning exercises: 08b (a layout under a memory budget), 11b (predict the bytes)
    lesson_12       the KV-head-to-rank map of grouped-query attention and its gradient reduction
    lesson_13       exercise 13 (inference): the argmax of vocab-parallel logits without gathering them

Rules about communication (how many collectives, of which kind, how many bytes) are checked from the tracer,
because the right numbers computed with the wrong collectives miss the point; values are compared first, so
a wrong value is diagnosed by its symptom before a rule is quoted.
"""

from tpsim.teach.checks import backward, lessons_01_05, lessons_06_11, planning  # noqa: F401 (they register)
from tpsim.teach.checks import lesson_12  # noqa: F401 (registers exercise 12)
from tpsim.teach.checks import lesson_13  # noqa: F401 (it registers)
from tpsim.teach.checks.registry import CHECKS, exercise  # noqa: F401

__all__ = ["CHECKS", "exercise"]

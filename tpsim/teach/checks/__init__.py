"""One check per exercise: the learner's function against tpsim's own layers, on real ranks, random inputs.

    registry        ``@exercise(...)`` and ``CHECKS``, the registry ``tpsim check`` reads
    lessons_01_05   the exercises of lessons 01–05 (block splits, f and g, row-parallel, MLP, qkv columns)
    lessons_06_11   the exercises of lessons 06–11 (parallel softmax, grad norm, DP average, SP, ring bytes)
    backward        the harder backward exercises: 04b (the parallel MLP), 06b (the vocab-parallel CE)
    planning        the harder planning exercises: 08b (a layout under a memory budget), 11b (predict the bytes)
    lesson_12       the KV-head-to-rank map of grouped-query attention and its gradient reduction
    lesson_13       exercise 13 (inference): the argmax of vocab-parallel logits without gathering them
    lesson_14       ZeRO-1's owned slices of a padded gradient bucket
    lesson_16       exercise 16: two memory terms of a real-size plan, by hand, against ``tpsim plan``
    lesson_15       mixed precision: bfloat16 rounding on the bits, the loss scaler's rule
    lesson_17       stage i's 1F1B compute order and its peak in flight, then that order on a live pipeline
    lesson_18       stage i's ZB-H1 order (the W's placed), a schedule's bubble and peak in flight for (p, m, v),
                    then those predictions against a live interleaved pipeline
    lesson_19       the exposed seconds of an overlapped DP sync's bucket schedule, and the Playbook's inequality
                    read bucket by bucket
    lesson_20       context parallelism: the online-softmax merge, the zigzag layout's chunks, the ring's forward
                    bytes, then those answers against a live ring (``lesson_20_live``, loaded only then: MPI)
    lesson_21       ZeRO's stages: bytes per parameter, an owned slice and its padding, a ZeRO-3 step's bytes, then
                    those answers against a live ZeRO-1 (``lesson_21_live``, loaded only then: MPI)

Rules about communication (how many collectives, of which kind, how many bytes) are checked from the tracer,
because the right numbers computed with the wrong collectives miss the point; values are compared first, so
a wrong value is diagnosed by its symptom before a rule is quoted.
"""

from tpsim.teach.checks import (backward, lesson_12, lesson_13, lesson_14, lesson_15, lesson_16,  # noqa: F401
                                 lesson_17, lesson_18, lesson_19, lesson_20, lesson_21, lessons_01_05,
                                 lessons_06_11, planning)
from tpsim.teach.checks.registry import CHECKS, exercise  # noqa: F401

__all__ = ["CHECKS", "exercise"]

"""Step 0's tolerances, by dtype: how far one forward and backward of the parallel model may differ from the
serial model's (``relative_difference``, purely relative, floor 1e-30). The step-0 verdict, the export's
read-back and the final-state verdict (its tolerance is never below these) all read them from here."""

TOLERANCE = {"float64": 1e-10, "float32": 1e-4,
             "bfloat16": 5e-2, "float16": 1e-2}  # 16-bit: see tpsim.train.mixed_precision.TOLERANCE_NOTE

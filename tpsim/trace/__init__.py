"""Reading the communication trace: records and spans as files, tables, measured memory, the formula check.

    records.py       gather to rank 0; comm.jsonl / spans.jsonl       schema.py    every field, documented
    aggregate.py     per-layer tables                                 module_table.py  CommDebugMode-style tree
    timeline.py      Chrome trace (timeline.json) and timeline.png    plots.py     loss and bytes-per-layer figures
    formula_check.py measured vs ``tpsim.predict.formulas``            measure.py   live bytes vs ``tpsim.predict.memory``
    run_folder.py    reading a run folder back                        cli.py       `tpsim plot`, `tpsim report`
    kind_split.py    each layer's time by kind (matmul, ..., waiting for the group): `tpsim report --by kind`
"""

from tpsim.trace.aggregate import CommRow, format_comm_table, summarize
from tpsim.trace.records import gather_records, gather_spans, write_jsonl

__all__ = ["CommRow", "format_comm_table", "gather_records", "gather_spans", "summarize", "write_jsonl"]

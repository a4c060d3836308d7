"""Reading the communication trace: aggregation, tables and files (plots and formulas build on these)."""

from tpsim.trace.aggregate import CommRow, format_comm_table, summarize
from tpsim.trace.records import gather_records, write_jsonl

__all__ = ["CommRow", "format_comm_table", "gather_records", "summarize", "write_jsonl"]

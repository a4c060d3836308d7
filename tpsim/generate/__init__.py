"""Tensor-parallel inference: greedy decoding with a per-rank KV cache (``python -m tpsim.generate``).

    argmax.py    the argmax of a vocab-parallel LM head with two all-reduces of [b], logits never gathered
    kv_cache.py  this rank's K and V (its heads only), attention of new queries against them
    decode.py    prefill, then one token at a time, on the serial model or its TP twin
    report.py    from the trace: prefill vs decode collectives, KV bytes vs TP and kv_heads, α-β per token
    cli.py       the command line
"""

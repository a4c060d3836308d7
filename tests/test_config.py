"""The run configuration (``tpsim.config``): one object, validated when it is made, one vocabulary per kind.

Each rule a run breaks is named in one ``ConfigError`` before anything is built; the other spellings of a dtype or
an architecture are accepted and printed in the one form; a ``plan.Layout`` is a ``Parallelism``, so the planner
and a run read tp, sp and zero from the same fields.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tpsim.arch import GPTConfig, LlamaConfig
from tpsim.config import (DTYPE_NAMES, OptimizerSettings, Parallelism, Pipeline, Precision, RunConfig, Schedule,
                          arch_name, dtype_name)
from tpsim.errors import ConfigError
from tpsim.plan.layout import Layout
from tpsim.plan.validate import CASES

GPT = GPTConfig(vocab_size=13, n_positions=8, n_embd=16, n_layer=1, n_head=4)
GPT3 = dataclasses.replace(GPT, n_layer=3)


@pytest.mark.parametrize("given, name", [("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32"),
                                         ("fp64", "float64"), (np.float32, "float32"), ("bfloat16", "bfloat16")])
def test_dtype_spellings_come_out_in_one_form(given, name):
    assert dtype_name(given) == name and Precision(given).dtype == name and name in DTYPE_NAMES


def test_an_unknown_dtype_or_architecture_names_the_choices():
    with pytest.raises(ConfigError, match="unknown dtype 'int8': choose from float64, float32, bfloat16, float16"):
        Precision("int8")
    with pytest.raises(ConfigError, match="unknown architecture 'bert': choose from gpt2, llama"):
        arch_name("bert")
    assert arch_name("gpt") == "gpt2" and arch_name("llama") == "llama"


def test_precision_says_what_mixed_precision_needs():
    assert not Precision("float64").half and not Precision("float32").loss_scaling
    assert Precision("bf16").half and not Precision("bf16").loss_scaling  # float32's range: no loss scale
    assert Precision("fp16").half and Precision("fp16").loss_scaling
    assert Precision("bfloat16").numpy.itemsize == 2


@pytest.mark.parametrize("make, message", [
    (lambda: RunConfig.of(GPT, tp=3), "heads 4 is not divisible by tp 3"),
    (lambda: RunConfig.of(GPT, dp=3, batch_size=16), "--batch-size 16 is not divisible by dp 3"),
    (lambda: RunConfig.of(GPT, tp=4, sp=True, seq_len=6), "--seq-len 6 is not divisible by tp 4"),
    (lambda: RunConfig.of(GPT, zero=4), "--zero 4: the ZeRO stages here are 0, 1, 2, 3"),
    (lambda: RunConfig.of(GPT, dp=2, zero=2, overlap_grad_reduce=True),
     "--overlap-grad-reduce with --zero 2: ZeRO-2 reduce-scatters each bucket during the backward already"),
    (lambda: RunConfig.of(GPT, dp=2, zero=3, overlap_param_gather=True),
     "--overlap-param-gather (ZeRO's all-gather under the next forward) needs --zero 1 or 2"),
    (lambda: RunConfig.of(dataclasses.replace(GPT, n_layer=4), pp=2, dp=2, zero=2, pipeline=Pipeline(schedule="interleaved", vp=2, microbatches=2)),
     "--vp 2 with --zero 2: a bucket shared by two chunks"),
    (lambda: RunConfig.of(GPT, tp=0), "--tp must be >= 1, got 0"),
    (lambda: RunConfig.of(GPT, pp=2), "2 pipeline stages for 1 layer: every stage needs at least one layer"),
    (lambda: RunConfig.of(GPT3, pp=2), "--layers 3 do not split evenly over 2 pipeline stages"),
    (lambda: RunConfig.of(GPT3, pp=2, pipeline=Pipeline(stage_layers=(1, 1))), "--pp-layers 1,1 sums to 2"),
    (lambda: RunConfig.of(GPT3, pp=2, pipeline=Pipeline(stage_layers=(1, 1, 1))), "names 3 stages"),
    (lambda: RunConfig.of(GPT3, pp=2, batch_size=6, pipeline=Pipeline(microbatches=4, stage_layers=(1, 2))),
     "--batch-size 6 does not split into dp x microbatches = 1 x 4"),
    (lambda: RunConfig.of(GPT, pipeline=Pipeline(microbatches=2)), "--microbatches, --vp and --pp-layers"),
    (lambda: RunConfig.of(GPT, pp=2, pipeline=Pipeline(schedule="gpipe")), "--schedule gpipe: unknown"),
    (lambda: OptimizerSettings(lr=float("nan")), "--lr must be >= 0, got nan"),
    (lambda: Schedule(steps=-1), "--steps must be >= 0, got -1"),
    (lambda: Schedule(dropout_rng="numpy"), "--dropout-rng 'numpy'"),
])
def test_every_broken_rule_is_one_named_error(make, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_a_run_is_frozen_and_replace_checks_again():
    run = RunConfig.of(GPT, tp=2, dp=2, batch_size=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.parallel.tp = 4  # type: ignore[misc]
    assert run.local_batch == 4 and run.arch == "gpt2" and run.dropout == 0.0
    with pytest.raises(ConfigError, match="heads 4 is not divisible by tp 3"):
        run.replace(parallel=Parallelism(tp=3))
    llama = RunConfig.of(LlamaConfig(vocab_size=13, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8))
    assert llama.arch == "llama" and llama.dropout == 0.0 and llama.schedule.seq_len == 8


def test_a_plan_layout_and_a_validation_case_say_tp_sp_zero_as_a_run_does():
    lay = Layout(tp=8, pp=4, dp=2, sp=True, zero=1, dtype="bf16")
    assert isinstance(lay, Parallelism) and lay.dtype == "bfloat16"
    assert lay.parallel == Parallelism(tp=8, dp=2, pp=4, sp=True, zero=1) and lay.gpus == lay.parallel.world == 64
    assert all(isinstance(case.parallel, Parallelism) and case.dtype in DTYPE_NAMES for case in CASES)


def test_a_layout_reads_every_field_it_shares_with_a_run_by_name():
    """``Layout.of_run``: the run's ``Parallelism`` whole and ``RUN_FIELDS`` from its other parts, none by hand. Every
    run field whose name is a Layout field is one of those (or the micro-batch), and each reaches the layout with a
    value unlike both defaults, so a dropped or mismatched entry fails."""
    from tpsim.plan.layout import RUN_FIELDS
    mine = {f.name for f in dataclasses.fields(Layout)}
    parts = {"schedule": Schedule, "precision": Precision, "pipeline": Pipeline, "optimizer": OptimizerSettings}
    named = {(part, f.name) for part, cls in parts.items() for f in dataclasses.fields(cls) if f.name in mine}
    assert named <= set(RUN_FIELDS.values()) and set(RUN_FIELDS) <= mine  # global_batch <- schedule.batch_size
    assert all(field in {f.name for f in dataclasses.fields(parts[part])} for part, field in RUN_FIELDS.values())
    assert {f.name for f in dataclasses.fields(Parallelism)} <= mine
    pipe = Pipeline(schedule="interleaved", microbatches=4, vp=2, stage_layers=(1, 1, 1, 1), clock="h100", mfu=0.25)
    run = RunConfig.of(GPTConfig(vocab_size=16, n_positions=32, n_embd=16, n_layer=4, n_head=4), tp=2, dp=2, pp=2,
                       sp=True, zero=1, batch_size=16, seq_len=32, dtype="float32", pipeline=pipe, bucket_mb=7.0,
                       overlap_grad_reduce=True, overlap_param_gather=True)
    lay = Layout.of_run(run, gpu="a100-80gb")
    for name, (part, field) in RUN_FIELDS.items():
        want = getattr(getattr(run, part), field)
        assert getattr(lay, name) == want != getattr(Layout, name), name
    assert lay.parallel == run.parallel and lay.micro_batch == run.micro_batch == 2 and lay.gpu == "a100-80gb"

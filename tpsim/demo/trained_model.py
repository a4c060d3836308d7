"""The demo's end: the trained model saved (``--save DIR``) and seen at work, reversing strings it never saw.

After the last step every TP group gathers its full parameters (``tpsim.hf.checkpoint.save_trained``, the tracer
paused: neither saving nor this demonstration is training traffic, so comm.jsonl and the FORMULA CHECK are those
of training alone). With ``--save`` rank 0 writes them as a Hugging Face folder — config.json + model.safetensors,
which ``--init-from DIR``, ``python -m tpsim.generate --init-from DIR`` and ``from_pretrained(DIR)`` read.

Then rank 0 builds the serial model from those parameters (float64) and greedy-decodes a few prompts of the
reverse task (``tpsim.data.reverse``: k digits, then SEP = 0) drawn from the batch of step ``--steps``, which
training never read. It prints each prompt, the model's answer and the expected one, and how many are right. A
wrong answer does not fail the run — a tiny model after a few steps may not have learnt the task yet — it is
printed as it is.
"""

from __future__ import annotations

import numpy as np

from tpsim.arch import architecture_of
from tpsim.config import RunConfig
from tpsim.data import ReverseTask
from tpsim.hf.checkpoint import load_into, save_trained

PROMPTS = 3  # strings the demo reverses


def gather_trained(grid, model, run: RunConfig) -> dict[str, np.ndarray] | None:
    """Collective over each TP group: the trained full parameters (written to ``--save`` by rank 0); on rank 0
    the tensors, elsewhere None."""
    tensors = save_trained(run.files.save, model, grid.tp_group, config=run.model, write=grid.rank == 0)
    return tensors if grid.rank == 0 else None


def _ids(row) -> str:
    return ",".join(str(int(t)) for t in row)


def reverse_lines(run: RunConfig, tensors: dict[str, np.ndarray], count: int = PROMPTS) -> list[str]:
    """Rank 0: the trained model (serial, float64, untraced) reversing ``count`` unseen strings, one line each."""
    from tpsim.generate.decode import greedy

    config, sch = run.model, run.schedule
    task = ReverseTask(config.vocab, sch.seq_len)
    prompts, expected = task.prompts(sch.seed, sch.steps, count)
    model = architecture_of(config).serial(config, sch.seed, np.float64)
    load_into(model, {name: np.asarray(a, dtype=np.float64) for name, a in tensors.items()})  # bfloat16 too
    answers, _ = greedy(model, prompts, task.digits)
    right = int(np.sum(np.all(answers == expected, axis=1)))
    lines = [f"The trained model reversing {count} strings it never saw (step {sch.steps}'s batch, greedy):",
             f"  prompt = {task.digits} digits, then the separator 0; answer = the next {task.digits} tokens"]
    for prompt, answer, want in zip(prompts, answers, expected):
        mark = "right" if np.array_equal(answer, want) else "wrong"
        lines.append(f"  {_ids(prompt)} → {_ids(answer)}  (expected {_ids(want)}: {mark})")
    lines.append(f"  {right} of {count} right" + ("" if right == count else
                 " — not a failed check: the model is tiny and trained briefly (more --steps helps)"))
    if run.files.save:
        lines += [f"saved the trained model to {run.files.save}/ (config.json, model.safetensors) and its training "
                  f"checkpoint (optimizer.safetensors, training_state.json: --resume {run.files.save}); decode it with",
                  f"  mpirun -n {run.parallel.tp} python -m tpsim.generate --init-from {run.files.save} "
                  f"--prompt {_ids(prompts[0])} --max-new-tokens {task.digits}"]
    return lines

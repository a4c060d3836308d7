"""The pipeline demo with one rank killed mid-pipeline, for tests/test_faults.py:
``pipeline_with_fault.py RANK STEP [DEMO FLAGS]``.

World rank RANK sends itself SIGKILL (a crashed node) right after posting its first pipeline message of step
STEP — the first micro-batch's activation, on a first stage — so its neighbours are left waiting in a receive
for messages that never come. The moment is printed to stderr (``FAULT kill at <time>``) for the test's "the job
ends within 10 s of it". The rest of the command line goes to ``python -m tpsim.demo`` (give it ``--pp``).
"""

import os
import signal
import sys
import time

from tpsim.comm.group import Group
from tpsim.comm.launch import run_main, world_rank
from tpsim.demo.cli import main

fault_rank, fault_step = int(sys.argv[1]), int(sys.argv[2])
del sys.argv[1:3]
real_send = Group.send


def send(self, x, peer, tag, **kwargs):
    real_send(self, x, peer, tag, **kwargs)
    if self.name == "pp" and self.tracer.step == fault_step and world_rank() == fault_rank:
        print(f"FAULT kill at {time.time():.3f}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


Group.send = send
run_main(main, prog="tpsim.demo")

"""``tpsim.pipeline.figure``: a box per compute action, labelled with its micro-batch (and chunk), on the time scale
asked for, so several schedules stacked in one figure (``draw_stacked``) compare on one axis — all without MPI."""

from __future__ import annotations

import pytest

from tpsim.pipeline.actions import COMPUTE
from tpsim.pipeline.clock import simulate
from tpsim.pipeline.figure import draw_on, draw_stacked
from tpsim.pipeline.grid import label
from tpsim.pipeline.schedules import build
from tpsim.plotting import pyplot


@pytest.mark.parametrize("name, p, m, v", [("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2), ("zb-h1", 3, 5, 1)])
def test_a_box_and_a_label_per_compute_action_on_the_scale_given(name, p, m, v):
    t = simulate(build(name, p, m, v))
    plt = pyplot()
    fig, ax = plt.subplots()
    draw_on(ax, t, step=2 * t.step)
    work = [a for actions in t.schedule.ranks for a in actions if a.op in COMPUTE]
    assert len(ax.collections) == p + len(work)  # one hatched idle band per rank, then one box per action
    assert sorted(text.get_text() for text in ax.texts) == sorted(label(a)[1:] for a in work)
    assert ax.get_xlim() == (0, 2 * t.step)
    plt.close(fig)


def test_stacked_schedules_are_written_as_one_png(tmp_path):
    timelines = [simulate(build("1f1b", 4, 8)), simulate(build("interleaved", 4, 8, 2)), simulate(build("zb-h1", 4, 8))]
    path = draw_stacked(timelines, tmp_path / "three.png", titles=["a", "b", "c"])
    assert path == tmp_path / "three.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

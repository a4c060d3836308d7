"""Collectives across nodes (``tpsim.nccl``) against NCCL's tuning model worked by hand, nccl-tests' figures, and
the scaling a data-parallel run shows.

The hand calculations restate NCCL's ``ncclTopoTuneModel`` for one case each, in its own terms (µs latencies,
GB/s bandwidths), not through the module's functions.
"""

from __future__ import annotations

import pytest

from tpsim.gpus import gpu
from tpsim.nccl import (Fabric, SpanningLink, alltoall_seconds, bus_bandwidth, collective_seconds, message_bytes,
                        option_seconds)
from tpsim.plan.comm import links
from tpsim.plan.layout import Layout
from tpsim.plan.models import PRESETS
from tpsim.plan.planner import plan

H100 = gpu("h100-80gb").fabric
A100 = gpu("a100-80gb").fabric


def test_the_fabrics_are_ncclss_own_link_counts():
    """NCCL's topology counts 20.6 GB/s an NVLink link on Hopper (18 of them on an H100 SXM), 20.0 on Ampere
    (12 on an A100); DGX nodes have 8 compute NICs, 400 Gb/s on an H100's, 200 on an A100's."""
    assert H100 == Fabric(370.8e9, 50e9, 8) and A100 == Fabric(240e9, 25e9, 8)


def test_a_ring_across_nodes_runs_at_its_nics_or_its_nvlink():
    assert bus_bandwidth(H100, 8, 1) == 370.8e9  # one node: NVLink
    assert bus_bandwidth(H100, 1, 64) == 50e9  # TP 8 fills the node: one NIC a node for the DP ring
    assert bus_bandwidth(H100, 2, 64) == 100e9  # TP 4: two DP ranks a node, two NICs
    assert bus_bandwidth(H100, 8, 64) == 370.8e9  # eight NICs carry 400 GB/s: NVLink is the slower hop
    assert bus_bandwidth(A100, 8, 4) == 200e9


def test_ring_simple_latency_by_hand():
    """A reduce-scatter over 16 ranks, 8 a node (2 nodes), Simple: baseLat 8.4 µs, 14 intra steps at
    max(hwLat 3.4, 3 × the 1 µs net overhead), 1 inter step at 14 µs: 70 µs before any byte."""
    assert option_seconds("reduce_scatter", 0, 16, 8, H100, "ring", "Simple") == pytest.approx(70e-6, rel=1e-12)
    # an all-reduce over 64 ranks, one a node: 2(n − 1) = 126 steps, 2·nodes = 128 of them inter: none intra
    assert option_seconds("all_reduce", 0, 64, 1, H100, "ring", "Simple") == pytest.approx(
        (8.4 + 128 * 14.0) * 1e-6, rel=1e-12)


def test_tree_latency_by_hand_and_when_nccl_takes_it():
    """Tree, Simple, 512 ranks 8 a node: 2·((8 − 1)·28 + log₂(64)·28) µs = 728 µs; the ring's 2·511 steps
    cost 4.8 ms, so at 64 nodes the tree wins even at 4 GB (its bandwidth 0.92·½ of the bus, the ring's 512/1022
    of it); over 2 nodes the ring's 30 steps cost little and its bandwidth wins a large all-reduce."""
    tree = option_seconds("all_reduce", 0, 512, 8, H100, "tree", "Simple")
    assert tree == pytest.approx(2 * (7 * 28 + 6 * 28) * 1e-6, rel=1e-12)
    assert collective_seconds("all_reduce", 1 << 20, 512, 8, H100)[1] == "tree"
    assert collective_seconds("all_reduce", 1 << 32, 512, 8, H100)[1:] == ("tree", "Simple")
    assert collective_seconds("all_reduce", 1 << 30, 16, 8, H100)[1:] == ("ring", "Simple")
    assert option_seconds("reduce_scatter", 1 << 20, 512, 8, H100, "tree", "Simple") is None  # all-reduce only


def busbw(op: str, nbytes: float, n: int, per_node: int, fabric: Fabric) -> float:
    """nccl-tests' bus bandwidth of the model's time: algbw × 2(n − 1)/n for an all-reduce."""
    t = collective_seconds(op, nbytes, n, per_node, fabric)[0]
    return nbytes / t * (2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n)


def test_large_messages_reach_the_bus_bandwidth_nccl_tests_report():
    """8 A100s in a DGX: nccl-tests' all_reduce_perf reports about 230–240 GB/s of bus bandwidth at 1 GB
    (NVLink 3, ring); two DGX H100s, 16 ranks: about 350–370 GB/s (eight 400 Gb/s NICs a node)."""
    assert 225e9 < busbw("all_reduce", 1 << 30, 8, 8, A100) <= 240e9
    assert 340e9 < busbw("all_reduce", 1 << 30, 16, 8, H100) <= 370.8e9


def test_alltoall_is_grouped_point_to_point_by_hand():
    """64 MB a rank over 8 H100s in a node: 7 chunks of 8 MB on NVLink, 56 MB / 370.8 GB/s, after baseLat
    8.4 µs + one NVLink hop 3.4 µs; over 16 ranks, 8 a node: 7 chunks on NVLink (28 MB) and 8 on the rank's own
    400 Gb/s NIC (32 MB / 50 GB/s = 640 µs, the slower part), the hop the network's 14 µs. NCCL's choice is
    named ("p2p", "Simple"); a group of one costs nothing."""
    mb = 64e6
    assert alltoall_seconds(mb, 8, 8, H100) == pytest.approx((8.4 + 3.4) * 1e-6 + 7 * 8e6 / 370.8e9, rel=1e-12)
    assert alltoall_seconds(mb, 16, 8, H100) == pytest.approx((8.4 + 14.0) * 1e-6 + 8 * 4e6 / 50e9, rel=1e-12)
    assert collective_seconds("all_to_all", mb, 16, 8, H100) == (alltoall_seconds(mb, 16, 8, H100), "p2p", "Simple")
    assert alltoall_seconds(mb, 1, 1, H100) == 0.0
    # nccl-tests' alltoall_perf bus bandwidth (algbw x (n - 1)/n) at 1 GB inside one DGX H100: NVLink's
    # 370.8 GB/s but for the 11.8 µs of latency in 2.5 ms
    big = 1 << 30
    assert 365e9 < busbw_of(big, alltoall_seconds(big, 8, 8, H100), 8) < 370.8e9


def busbw_of(nbytes: float, seconds: float, n: int) -> float:
    return nbytes / seconds * (n - 1) / n


def test_message_bytes_inverts_wire_bytes():
    from tpsim.cost import wire_bytes
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"):
        for n in (2, 3, 8, 64):
            assert message_bytes(op, wire_bytes(op, 6_000_000, n), n) == pytest.approx(6_000_000, rel=1e-6)


def test_the_dp_link_spans_nodes_only_when_the_job_does():
    one = links(Layout(tp=2, dp=4), gpu("h100-80gb"))["dp"]
    many = links(Layout(tp=2, dp=64), gpu("h100-80gb"))["dp"]
    assert one == gpu("h100-80gb").intra and isinstance(many, SpanningLink) and many.per_node == 4
    assert (many.alpha, many.bandwidth) == (gpu("h100-80gb").inter.alpha, 50e9)  # its p2p messages: one NIC


@pytest.mark.parametrize("overlap", [False, True])
def test_a_tp4_model_scales_from_16_to_2048_gpus_at_fixed_batch_per_gpu(overlap):
    """Llama 3 8B at TP 4 + SP, ZeRO-1, 8 micro-batches a DP rank: a flat ring on one NIC grew its step ~45 %
    from 16 to 2048 GPUs; priced as NCCL runs it, with Megatron's buckets, it grows by under 10 %."""
    steps = []
    for gpus in (16, 256, 2048):
        dp = gpus // 4
        lay = Layout(tp=4, dp=dp, sp=True, seq_len=4096, global_batch=8 * dp, zero=1, attention="fused",
                     overlap_grad_reduce=overlap, overlap_param_gather=overlap)
        steps.append(plan(PRESETS["llama3-8b"], lay).time_s["step"])
    assert steps[0] <= steps[1] <= steps[2] < 1.10 * steps[0]


@pytest.mark.parametrize("name, bf16, fp8, domain, nvlink, nic", [
    ("h800-80gb", 989e12, 1979e12, 8, 8 * 20.6e9, 50e9),  # the H100's compute, 8 of its 18 NVLink links
    ("b200", 2250e12, 4500e12, 8, 18 * 40.1e9, 50e9),  # HGX B200 at 1,000 W; ConnectX-7 400 Gb/s
    ("gb200", 2500e12, 5000e12, 72, 18 * 40.1e9, 50e9),  # the NVL72's B200 at 1,200 W: one 72-GPU NVLink domain
    ("gb300", 2500e12, 5000e12, 72, 18 * 40.1e9, 100e9),  # ConnectX-8 800 Gb/s
])
def test_the_newer_gpus_carry_their_datasheets_rates_and_ncclss_view(name, bf16, fp8, domain, nvlink, nic):
    g = gpu(name)
    assert (g.peak("bfloat16"), g.peak("fp8"), g.nvlink_domain) == (bf16, fp8, domain)
    assert (g.fabric.nvlink, g.fabric.nic) == (nvlink, nic)
    assert Layout(gpu=name).gpus_per_node == domain and Layout(gpu=name, gpus_per_node=4).gpus_per_node == 4


def test_an_nvl72_keeps_a_72_gpu_dp_group_on_nvlink():
    """GB200 NVL72: TP 4 × DP 18 is one NVLink domain, so the DP sync is priced on NVLink, not on the NICs."""
    dp = links(Layout(tp=4, dp=18, gpu="gb200"), gpu("gb200"))["dp"]
    assert not hasattr(dp, "collective") and dp.bandwidth == 900e9
    assert hasattr(links(Layout(tp=4, dp=18, gpu="b200"), gpu("b200"))["dp"], "collective")  # 9 HGX nodes


def test_megatrons_bucket_rule_by_hand():
    """max(40 M, 1 M x dp x cp) parameters a bucket at the gradients' bytes when reduced during the backward
    (megatron/core/distributed/distributed_data_parallel.py); one bucket a stage without the overlap; --bucket-mb
    when given."""
    from tpsim.plan.dp_overlap import bucket_cap_bytes
    assert bucket_cap_bytes(Layout(dp=8, overlap_grad_reduce=True)) == 40_000_000 * 4  # bf16: fp32 gradients
    assert bucket_cap_bytes(Layout(dp=64, cp=2, overlap_grad_reduce=True)) == 128_000_000 * 4
    assert bucket_cap_bytes(Layout(dp=64, zero=2)) == 64_000_000 * 4  # ZeRO-2 reduces in every backward
    assert bucket_cap_bytes(Layout(dp=64)) > 10 ** 15  # no overlap: one bucket a stage
    assert bucket_cap_bytes(Layout(dp=64, bucket_mb=25)) == 25 * 2 ** 20

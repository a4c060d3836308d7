"""The demo's mixture-of-experts flags: the model's experts (``tpsim.arch.mixtral``) and where they go
(``tpsim.config.experts``), and the model config they make."""

from __future__ import annotations

import argparse

from tpsim.arch.mixtral import ROUTER_KINDS
from tpsim.config.experts import DISPATCHERS
from tpsim.errors import ConfigError
from tpsim.options import count, non_negative, positive, whole

KNOBS = ("experts", "top_k", "moe_ffn", "shared_experts", "router", "capacity_factor", "aux_loss_coef",
         "z_loss_coef", "moe_layers")


def expert_arguments(g) -> None:
    """--arch mixtral's experts and the expert layout (Parallel Folding)."""
    g.add_argument("--experts", type=count, default=None, help="mixtral: experts per MoE layer (default 8)")
    g.add_argument("--top-k", type=count, default=None, help="mixtral: experts each token goes to (default 2)")
    g.add_argument("--moe-ffn", type=count, default=None,
                   help="mixtral: each expert's SwiGLU width (Mixtral's intermediate_size; the same as --ffn)")
    g.add_argument("--shared-experts", type=whole, default=None,
                   help="mixtral: always-on SwiGLU experts beside the routed ones (DeepSeek's; default 0)")
    g.add_argument("--router", choices=ROUTER_KINDS, default=None,
                   help="mixtral: softmax (Mixtral's: the top-k renormalised; default) or sigmoid (DeepSeek-V3's: "
                        "scores with a selection bias, no auxiliary loss)")
    g.add_argument("--capacity-factor", type=positive, default=None,
                   help="mixtral: each expert keeps at most ceil(c x tokens x k / E) of a rank's tokens, the later "
                        "ones dropped and counted (default: dropless)")
    g.add_argument("--aux-loss-coef", type=non_negative, default=None,
                   help="mixtral: the load-balancing loss's coefficient (default 0.01; 0 with --router sigmoid)")
    g.add_argument("--z-loss-coef", type=non_negative, default=None, help="mixtral: the router z-loss's (default 0)")
    g.add_argument("--moe-layers", default=None, metavar="all|K:",
                   help="mixtral: which layers are MoE: all (default) or K: (from layer K on; the first K keep a "
                        "dense SwiGLU, DeepSeek's first_k_dense_replace)")
    g.add_argument("--ep", type=count, default=1,
                   help="expert-parallel size: the MoE layers fold each stage's tp x cp x dp ranks into etp x ep "
                        "x expert-dp; E/ep experts a rank (default 1)")
    g.add_argument("--etp", type=count, default=1, help="expert tensor parallelism: each expert cut by columns "
                   "over etp ranks (default 1)")
    g.add_argument("--dispatcher", choices=DISPATCHERS, default="alltoall",
                   help="how tokens reach their experts: alltoall (counts, then all-to-all-v; default) or "
                        "allgather (every token to every rank of the expert group, partial outputs reduce-"
                        "scattered back)")


def moe_layers(spec: str | None) -> int | None:
    """``--moe-layers``: ``all`` -> 0 dense layers first, ``K:`` -> K (None: not given)."""
    if spec is None:
        return None
    if spec == "all":
        return 0
    if spec.endswith(":") and spec[:-1].isdigit():
        return int(spec[:-1])
    raise ConfigError(f"--moe-layers {spec!r}: all, or K: (MoE from layer K on)")


def with_experts(model, args: argparse.Namespace):
    """``model`` with the MoE flags applied; ``ConfigError`` when one is given to a dense architecture."""
    given = [k for k in KNOBS if getattr(args, k) is not None]
    if not hasattr(model, "with_experts"):
        if given:
            raise ConfigError(f"--{given[0].replace('_', '-')} sets a mixture of experts: it needs --arch mixtral")
        return model
    if args.moe_ffn is not None and args.ffn is not None and args.moe_ffn != args.ffn:
        raise ConfigError(f"--moe-ffn {args.moe_ffn} and --ffn {args.ffn}: for --arch mixtral both are the expert "
                          "width; give one")
    return model.with_experts(
        num_local_experts=args.experts, num_experts_per_tok=args.top_k, intermediate_size=args.moe_ffn,
        shared_experts=args.shared_experts, router=args.router, capacity_factor=args.capacity_factor,
        router_aux_loss_coef=0.0 if args.router == "sigmoid" and args.aux_loss_coef is None else args.aux_loss_coef,
        router_z_loss_coef=args.z_loss_coef, first_dense_layers=moe_layers(args.moe_layers))

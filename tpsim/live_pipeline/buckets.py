"""A live run's DP gradient buckets as the virtual clock and the planner see them: bytes and the piece that
produces each bucket's last gradient (``tpsim.pipeline.overlap``).

``bucket_specs(shard, grad_sync)`` gives, per bucket of this rank's ``GradSync`` (or ZeRO-1's), a
``BucketSpec(nbytes, stage, piece, held, first_use)``: its padded bytes, the virtual stage and piece (head, a layer, the
embedding) whose backward finishes its last gradient — the latest of its parameters' pieces in execution order
(a higher virtual stage's backward runs first on a rank; within a stage, ``backward_pieces`` order) — and
whether it waits for the tied embedding's sum over the embedding group, and the first forward piece that reads it
(the lowest virtual stage first: a rank's chunk 0 runs micro-batch 0 first). ``ShardedPieces`` places ZeRO-2/3's
traced collectives inside an action on the pieces they belong to, for
``tpsim.live_pipeline.clock.LiveClock.sharded_action``. MPI-free.
"""

from __future__ import annotations

from tpsim.pipeline.overlap import BucketSpec, backward_pieces, forward_pieces, piece_of
from tpsim.train.protocol import zero_of


def chunk_layers(chunk) -> list[int]:
    """The model's layer indices a ``ModelChunk`` holds (its blocks' paths end in the index)."""
    return [int(b.path.rsplit(".", 1)[1]) for b in chunk.blocks]


def embed_names(config) -> tuple[str, ...]:
    """The paths of the embedding's parameters: the token embedding and, for a learned table, the positions'."""
    table = config.position_table
    return (config.layer_names.embed,) + ((table.rsplit(".", 1)[0],) if table else ())


def parameter_pieces(shard) -> dict[str, tuple[int, tuple, int]]:
    """Each parameter name of ``shard`` -> (virtual stage, piece, its position in the rank's backward order)."""
    block, embeds = shard.config.layer_names.block, embed_names(shard.config)
    out, order = {}, 0
    for chunk in sorted(shard.chunks, key=lambda c: -c.stage):  # the higher virtual stage's backward runs first
        keys = backward_pieces(chunk_layers(chunk), chunk.first, chunk.last)
        rank = {k: order + i for i, k in enumerate(keys)}
        for name, _ in chunk.named_parameters():
            key = piece_of(name, block, embeds, chunk.first)
            out[name] = (chunk.stage, key, rank[key])
        order += len(keys)
    return out


class Pieces:
    """Each virtual stage's backward pieces in execution order (``keys[stage]``) and which piece a traced
    collective's scope belongs to (``scoped``), for the clock of ``shard``."""

    def __init__(self, shard) -> None:
        self.block, self.embeds = shard.config.layer_names.block, embed_names(shard.config)
        self.keys = {c.stage: backward_pieces(chunk_layers(c), c.first, c.last) for c in shard.chunks}
        self.first = {c.stage: c.first for c in shard.chunks}

    def scoped(self, events, stage: int) -> list[tuple]:
        """``(piece, event)`` of every collective in ``events`` (traced inside one action of ``stage``)."""
        return [(piece_of(e.scope, self.block, self.embeds, self.first[stage]), e) for e in events]


def bucket_specs(shard, grad_sync, held: bool = False) -> list[BucketSpec]:
    """Every bucket of ``grad_sync`` over ``shard`` (module docstring); ``held``: the tied embedding's bucket
    waits (the sync holds it: ``--overlap-grad-reduce`` with pp > 1)."""
    pieces = parameter_pieces(shard)
    shared = shard.shared_embedding
    tied = {f"{shared.path}.weight"} if shared is not None and held else set()
    forward = {(c.stage, k): i for c in shard.chunks
               for i, k in enumerate(forward_pieces(chunk_layers(c), c.first, c.last))}
    out = []
    for bucket in grad_sync.buckets:
        stage, key, _ = max((pieces[n] for n in bucket.names), key=lambda t: t[2])
        first = min((pieces[n][:2] for n in bucket.names), key=lambda sk: (sk[0], forward[sk]))
        out.append(BucketSpec(bucket.nbytes, stage, key, bool(tied & set(bucket.names)), first))
    return out


def zero_bucket(scope: str) -> tuple[str, int] | None:
    """``("params", i)`` for ZeRO-3's all-gather of bucket i (scope ``zero.params{i}``, ``tpsim.train.zero3``),
    ``("bucket", i)`` for a reduce-scatter of gradient bucket i (``zero.bucket{i}``), None for any other scope."""
    for kind in ("params", "bucket"):
        head = f"zero.{kind}"
        if scope.startswith(head) and scope[len(head):].isdigit():
            return kind, int(scope[len(head):])
    return None


class ShardedPieces:
    """ZeRO-2/3's collectives inside one action, by piece, for the live clock (``tpsim.pipeline.prefetch``): a
    reduce-scatter of bucket i belongs to the piece whose backward finishes it (``bucket_specs``); a ZeRO-3
    all-gather of bucket i to a piece that reads it, each reader one gather an action (a tied LM head at pp 1
    reads the embedding's bucket too: two gathers of one bucket, the same bytes, so which reader takes which
    changes no time)."""

    def __init__(self, shard, grad_sync) -> None:
        self.pieces = Pieces(shard)
        self.gathers = zero_of(grad_sync).gathers_around_units  # ZeRO-3: the parameters are gathered too
        self.finishes = {i: (s.stage, s.piece) for i, s in enumerate(bucket_specs(shard, grad_sync))}
        self.readers: dict[tuple[int, int], list[tuple]] = {}  # (stage, bucket) -> the pieces reading it
        sharded_params = grad_sync.sharded_params if self.gathers else None
        for chunk in shard.chunks if sharded_params is not None else ():
            mine = {id(m) for _, m in chunk.named_modules()}
            for unit in sharded_params.units:
                if id(unit) in mine:
                    key = piece_of(unit.path, self.pieces.block, self.pieces.embeds, chunk.first)
                    for i in sharded_params.unit_buckets[id(unit)]:
                        self.readers.setdefault((chunk.stage, i), []).append(key)

    def split(self, events, stage: int, op: str) -> tuple[list, list[tuple], list[tuple]]:
        """``events`` (traced inside one action ``op`` of ``stage``) as (the other collectives, ``(piece,
        event)`` of each ZeRO all-gather, ``(piece, event)`` of each ZeRO reduce-scatter); a RuntimeError when
        one cannot be placed."""
        rest, gathers, scatters, seen = [], [], [], {}
        for e in events:
            which = zero_bucket(e.scope)
            if which is None or (which[0] == "bucket" and e.op != "reduce_scatter"):
                rest.append(e)
            elif which[0] == "params":
                readers = self.readers.get((stage, which[1]), [])
                k = seen[which[1]] = seen.get(which[1], -1) + 1
                if k >= len(readers):
                    raise RuntimeError(f"{op} of virtual stage {stage}: all-gather {k + 1} of ZeRO-3 bucket "
                                       f"{which[1]}, which {len(readers)} piece(s) here read")
                gathers.append((readers[k], e))
            else:
                where = self.finishes[which[1]]
                if where[0] != stage:
                    raise RuntimeError(f"{op} of virtual stage {stage} reduce-scattered bucket {which[1]}, whose "
                                       f"last gradient is virtual stage {where[0]}'s")
                scatters.append((where[1], e))
        return rest, gathers, scatters

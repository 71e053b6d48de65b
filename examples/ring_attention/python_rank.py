"""One rank of examples/ring_attention written in Python: torch.distributed's Gloo process group
and ring attention in plain PyTorch, in one group with the C++ ranks of ./ring-attention.

    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 python3 python_rank.py

It speaks the C++ ranks' protocol: the same check that every rank has the same problem (two
all-gathers), then one transfer per ring step of the keys, values (and padding) in one flat
buffer, tag = step. Forward only; checks its shard against one process, as the C++ ranks do.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist

BATCH, HEADS, KV_HEADS, D, BLOCK = 2, 8, 4, 64, 256


def shard(t, rank, world):
    """Chunks rank and 2W-1-rank of 2W along the sequence (dim 2): the balanced split."""
    chunks = t.chunk(2 * world, dim=2)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim=2).contiguous()


def check_same(group, values):
    """The C++ Group::check_same: the number of values, then the values, from every rank."""
    world = group.size()
    for tensor in (torch.tensor([len(values)]), torch.tensor(values, dtype=torch.int64)):
        out = [torch.empty_like(tensor) for _ in range(world)]
        group.allgather([out], [tensor]).wait()
        for rank, theirs in enumerate(out):
            if not torch.equal(theirs, tensor):
                sys.exit(f"rank {group.rank()}: rank {rank} has {theirs.tolist()}, "
                         f"this rank {tensor.tolist()}")


def attend(q, k, v, causal):
    """Output and log-sum-exp of one (query chunk, key chunk) pair, causal inside the chunk."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        hidden = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(hidden, -torch.inf)
    lse = scores.logsumexp(-1)
    return (scores - lse.unsqueeze(-1)).exp() @ v, lse


def ring_attention(group, q, k, v):
    """Causal ring attention on the balanced shards, merged through the log-sum-exp."""
    rank, world = group.rank(), group.size()
    local, chunk = q.shape[2], q.shape[2] // 2
    check_same(group, [BATCH, HEADS, KV_HEADS, local, D, D, int(6), 1, 0, 0, 0, BLOCK])
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:3], -torch.inf)
    current = torch.cat([k.flatten(), v.flatten()])
    for step in range(world):
        if step + 1 < world:
            incoming = torch.empty_like(current)
            sent = group.send([current], (rank + 1) % world, step)
            received = group.recv([incoming], (rank - 1) % world, step)
        owner = (rank - step) % world
        k_b = current[: k.numel()].view_as(k)
        v_b = current[k.numel():].view_as(v)
        for qc, qi in enumerate((rank, 2 * world - 1 - rank)):
            for kc, ki in enumerate((owner, 2 * world - 1 - owner)):
                if ki > qi:
                    continue
                rows = slice(qc * chunk, (qc + 1) * chunk)
                o, l = attend(q[:, :, rows], k_b[:, :, kc * chunk:(kc + 1) * chunk],
                              v_b[:, :, kc * chunk:(kc + 1) * chunk], causal=ki == qi)
                total = torch.logaddexp(lse[:, :, rows], l)
                out[:, :, rows] = (out[:, :, rows] * (lse[:, :, rows] - total).exp().unsqueeze(-1)
                                   + o * (l - total).exp().unsqueeze(-1))
                lse[:, :, rows] = total
        if step + 1 < world:
            received.wait()
            sent.wait()
            current = incoming
    return out


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=60)
    address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
               timeout)
    try:  # 2.2+ may serve the store with libuv, which Debian 13's torch lacks; 1.13 cannot
        store = dist.TCPStore(*address, use_libuv=os.environ.get("USE_LIBUV") == "1")
    except TypeError:
        store = dist.TCPStore(*address)
    group = dist.ProcessGroupGloo(store, rank, world, timeout)
    length = int(sys.argv[sys.argv.index("--length") + 1]) if "--length" in sys.argv else 1536

    torch.manual_seed(0)  # the same draws as the C++ ranks
    q = torch.randn(BATCH, HEADS, length, D)
    k = torch.randn(BATCH, KV_HEADS, length, D)
    v = torch.randn(BATCH, KV_HEADS, length, D)
    out = ring_attention(group, shard(q, rank, world), shard(k, rank, world),
                         shard(v, rank, world))
    whole, _ = attend(q, k, v, causal=True)
    diff = (out - shard(whole, rank, world)).abs().max().item()
    ok = diff <= 1e-5
    print(f"rank {rank} of {world} (Python {torch.__version__}): ring attention output, "
          f"max |difference| {diff:.3g}: {'matches one process' if ok else 'DIFFERS'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

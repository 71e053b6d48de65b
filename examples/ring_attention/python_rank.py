"""One rank of examples/ring_attention written in Python: torch.distributed's Gloo process group
and ring attention in plain PyTorch, in one group with the C++ ranks of ./ring-attention.

    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 python3 python_rank.py

It speaks the C++ ranks' protocol: the check that every rank has the same problem (a header of
20 int64 sent to every other rank, tag 3 << 20: error kind, message bytes, number of values, the
values; src/distributed/collectives.cpp describes it), then one transfer per ring step of the
keys, values (and padding) in one flat buffer, tag = step. Forward only; checks its shard
against one process, as the C++ ranks do.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist

BATCH, HEADS, KV_HEADS, D, BLOCK = 2, 8, 4, 64, 256
CHECK_TAG, CHECK_DETAILS_TAG, HEADER = 3 << 20, (3 << 20) + 1, 20
FLOAT = 6  # c10::ScalarType::Float


def shard(t, rank, world):
    """Chunks rank and 2W-1-rank of 2W along the sequence (dim 2): the balanced split."""
    chunks = t.chunk(2 * world, dim=2)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim=2).contiguous()


def check_same(group, values):
    """Group::check_same of the C++ ranks, for a rank without an error of its own: every rank
    sends every other rank its header; details follow only when a rank failed."""
    rank, world = group.rank(), group.size()
    header = torch.zeros(HEADER, dtype=torch.int64)
    header[2] = len(values)
    header[3:3 + len(values)] = torch.tensor(values, dtype=torch.int64)
    theirs = {r: torch.empty(HEADER, dtype=torch.int64) for r in range(world) if r != rank}
    works = [group.recv([t], r, CHECK_TAG) for r, t in theirs.items()]
    works += [group.send([header], r, CHECK_TAG) for r in theirs]
    for work in works:
        work.wait()
    if any(t[0] != 0 for t in theirs.values()):
        # A rank refused its input: its message comes with the details, which every rank sends.
        payload = header[3:3 + len(values)].view(torch.uint8)
        details = {r: torch.empty(8 * int(t[2]) + int(t[1]), dtype=torch.uint8)
                   for r, t in theirs.items()}
        works = [group.recv([d], r, CHECK_DETAILS_TAG) for r, d in details.items() if d.numel()]
        works += [group.send([payload], r, CHECK_DETAILS_TAG) for r in theirs]
        for work in works:
            work.wait()
        first = min(r for r, t in theirs.items() if t[0] != 0)
        message = bytes(details[first][8 * int(theirs[first][2]):].tolist()).decode()
        sys.exit(f"rank {rank}: rank {first} failed: {message}")
    for r, t in theirs.items():
        if not torch.equal(t, header):
            sys.exit(f"rank {rank}: rank {r} has {t[3:].tolist()}, this rank {values}")


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
    # (B, H, Hkv, T_local, d, dv, dtype, causal, balanced, padding, scale set, scale bits, block)
    check_same(group, [BATCH, HEADS, KV_HEADS, local, D, D, FLOAT, 1, 1, 0, 0, 0, BLOCK])
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

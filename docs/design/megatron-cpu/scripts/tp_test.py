# usage: tp_test.py TP [sp]  -- TP=1 saves reference weights/loss/grads; TP>1 loads them sharded and compares.
import os, sys, warnings, datetime
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *
import torch, torch.distributed as dist, torch.multiprocessing as mp
OUT = "/tmp/mcore-scripts/out"; os.makedirs(OUT, exist_ok=True)
def is_gated_fc1(name): return name.endswith("mlp.linear_fc1.weight")
def shard(name, full, p, r, n):
    if not getattr(p, "tensor_model_parallel", False): return full
    d = p.partition_dim
    if is_gated_fc1(name):
        g, u = full.chunk(2, dim=d); return torch.cat([g.chunk(n, d)[r], u.chunk(n, d)[r]], d)
    return full.chunk(n, dim=d)[r]
def unshard(name, t, p, n):
    if not getattr(p, "tensor_model_parallel", False): return t
    d = p.partition_dim; parts = [torch.empty_like(t) for _ in range(n)]
    from megatron.core import parallel_state as ps
    dist.all_gather(parts, t.contiguous(), group=ps.get_tensor_model_parallel_group())
    if is_gated_fc1(name):
        gs, us = zip(*[x.chunk(2, d) for x in parts]); return torch.cat([torch.cat(gs, d), torch.cat(us, d)], d)
    return torch.cat(parts, d)
def worker(rank, world, sp):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29521")
    torch.set_num_threads(1)
    import cpu_patches
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    from megatron.core import parallel_state as ps, tensor_parallel
    cpu_patches.apply()
    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    cfg = qwen_like_config(tp=world, sequence_parallel=sp)
    m = build_gpt(cfg)
    ids, pos, mask = batch()
    if world == 1:
        torch.save({k: v.clone() for k, v in m.state_dict().items() if v is not None and torch.is_tensor(v)}, f"{OUT}/ref_sd.pt")
    else:
        ref = torch.load(f"{OUT}/ref_sd.pt")
        same_init = all(torch.equal(shard(n, ref[n], p, rank, world), p.data) for n, p in m.named_parameters())
        if rank == 0: print("native cpu-init shards == TP1 weights:", same_init)
        with torch.no_grad():
            for n, p in m.named_parameters(): p.copy_(shard(n, ref[n], p, rank, world))
    loss = m(ids, pos, mask, labels=ids)
    lm = loss.float().mean(); lm.backward()
    if sp:  # replicated norm grads are partial under SP: allreduce over TP (what finalize_model_grads does)
        for p in m.parameters():
            if getattr(p, "sequence_parallel", False): dist.all_reduce(p.grad, group=ps.get_tensor_model_parallel_group())
    grads = {n: unshard(n, p.grad, p, world) for n, p in m.named_parameters()}
    if rank == 0:
        print(f"TP={world} sp={sp} loss={lm.item():.8f}")
        if world == 1:
            torch.save({"loss": lm.item(), "grads": grads}, f"{OUT}/ref_out.pt")
        else:
            ref = torch.load(f"{OUT}/ref_out.pt")
            print(f"|loss diff| = {abs(lm.item()-ref['loss']):.3e}")
            md = max((grads[n]-ref["grads"][n]).abs().max().item() for n in grads)
            print(f"max |grad diff| over {len(grads)} params = {md:.3e}")
        print("patch hits:", sorted(cpu_patches.HITS))
    dist.barrier(); dist.destroy_process_group()
if __name__ == "__main__":
    tp = int(sys.argv[1]); sp = len(sys.argv) > 2 and sys.argv[2] == "sp"
    mp.spawn(worker, args=(tp, sp), nprocs=tp, join=True)

# usage: pp_test.py PP [nobatch] [nopatch] -- PP=1 (world 1) and PP=2 (world 2) via get_forward_backward_func, gloo.
# Weights come from out/ref_sd.pt (written by `tp_test.py 1`); PP=1 writes out/pp_ref.pt, PP=2 compares.
import os, sys, datetime, traceback
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *
import torch, torch.distributed as dist, torch.multiprocessing as mp
OUT = "/tmp/mcore-scripts/out"
NL = 2
def worker(rank, world, batch_p2p, patch):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")
    torch.set_num_threads(1)
    import cpu_patches
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    from megatron.core import parallel_state as ps, tensor_parallel
    from megatron.core.pipeline_parallel import get_forward_backward_func
    cpu_patches.apply()
    if patch: cpu_patches.apply_pipeline()
    ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=world)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    cfg = qwen_like_config(pp=world, num_layers=NL, batch_p2p_comm=batch_p2p)
    pre, post = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
    m = build_gpt(cfg, pre_process=pre, post_process=post)
    ref = torch.load(f"{OUT}/ref_sd.pt"); off = rank * NL // world
    def ref_name(n):
        if n.startswith("decoder.layers."):
            parts = n.split("."); parts[2] = str(int(parts[2]) + off); return ".".join(parts)
        return n
    with torch.no_grad():
        for n, p in m.named_parameters(): p.copy_(ref[ref_name(n)])
    mbs = [batch(seed=s) for s in range(2)]
    it = iter(mbs)
    def loss_func(output_tensor):
        l = output_tensor.float().mean(); return l, {"lm loss": l.detach().clone()}
    def forward_step(data_iterator, model):
        ids, pos, mask = next(data_iterator)
        return model(ids, pos, mask, labels=ids), loss_func
    fb = get_forward_backward_func()
    try:
        res = fb(forward_step_func=forward_step, data_iterator=it, model=[m], num_microbatches=2,
                 seq_length=16, micro_batch_size=2, forward_only=False)
    except Exception as e:
        print(f"rank{rank} FAIL {type(e).__name__}: {str(e)[:200]}"); traceback.print_exc(limit=-4); os._exit(1)
    grads = {ref_name(n): p.grad.clone() for n, p in m.named_parameters()}
    allg = [None] * world; dist.all_gather_object(allg, grads)
    if post:
        loss = sum(d["lm loss"].item() for d in res) / len(res)
        print(f"PP={world} batch_p2p_comm={batch_p2p} fb={fb.__name__} loss={loss:.8f}")
        g = {k: v for d in allg for k, v in d.items()}
        if world == 1: torch.save({"loss": loss, "grads": g}, f"{OUT}/pp_ref.pt")
        else:
            r = torch.load(f"{OUT}/pp_ref.pt")
            print(f"|loss diff|={abs(loss-r['loss']):.3e}  max|grad diff|={max((g[k]-r['grads'][k]).abs().max().item() for k in g):.3e} over {len(g)} params")
        print("patch hits:", sorted(cpu_patches.HITS))
    dist.barrier(); dist.destroy_process_group()
if __name__ == "__main__":
    pp = int(sys.argv[1]); batch_p2p = "nobatch" not in sys.argv; patch = "nopatch" not in sys.argv
    mp.spawn(worker, args=(pp, batch_p2p, patch), nprocs=pp, join=True)

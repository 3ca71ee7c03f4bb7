# Interleaved pipeline (PP=2, VPP=2, 4 layers) vs PP=1 on CPU/gloo.  usage: vpp_test.py 1 | vpp_test.py 2
import os, sys, datetime, traceback
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *
import torch, torch.distributed as dist, torch.multiprocessing as mp
OUT = "/tmp/mcore-scripts/out"; NL = 4
def worker(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    torch.set_num_threads(1)
    import cpu_patches
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    from megatron.core import parallel_state as ps, tensor_parallel
    from megatron.core.pipeline_parallel import get_forward_backward_func
    cpu_patches.apply(); cpu_patches.apply_pipeline()
    vpp = 2 if world > 1 else None
    ps.initialize_model_parallel(1, world, virtual_pipeline_model_parallel_size=vpp)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    cfg = qwen_like_config(pp=world, num_layers=NL, virtual_pipeline_model_parallel_size=vpp, batch_p2p_comm="nobatch" not in sys.argv, overlap_p2p_comm="overlap" in sys.argv)
    if rank == 0: print("batch_p2p_comm =", cfg.batch_p2p_comm, "overlap_p2p_comm =", cfg.overlap_p2p_comm)
    chunks = []
    for v in range(vpp or 1):
        pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=v) if vpp else True
        post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=v) if vpp else True
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        chunks.append(GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                 vocab_size=128, max_sequence_length=64, position_embedding_type="rope", share_embeddings_and_output_weights=False,
                 pre_process=pre, post_process=post, **({"vp_stage": v} if vpp else {})))
    def gname(c, n):
        if n.startswith("decoder.layers."):
            p = n.split("."); p[2] = str(c.decoder.layers[int(p[2])].layer_number - 1); return ".".join(p)
        return n
    if world == 1:
        torch.save({n: p.detach().clone() for n, p in chunks[0].named_parameters()}, f"{OUT}/vpp_ref_sd.pt")
    else:
        ref = torch.load(f"{OUT}/vpp_ref_sd.pt")
        with torch.no_grad():
            for c in chunks:
                for n, p in c.named_parameters(): p.copy_(ref[gname(c, n)])
    mbs = [batch(seed=s) for s in range(4)]
    its = [iter(mbs) for _ in chunks]
    def loss_func(o):
        l = o.float().mean(); return l, {"lm loss": l.detach().clone()}
    def fstep(di, mdl):
        ids, pos, mask = next(di); return mdl(ids, pos, mask, labels=ids), loss_func
    fb = get_forward_backward_func()
    try:
        res = fb(forward_step_func=fstep, data_iterator=its if vpp else its[0], model=chunks, num_microbatches=4,
                 seq_length=16, micro_batch_size=2, forward_only=False)
    except Exception as e:
        print(f"rank{rank} FAIL {type(e).__name__}: {str(e)[:300]}"); traceback.print_exc(limit=-4); os._exit(1)
    grads = {gname(c, n): p.grad.clone() for c in chunks for n, p in c.named_parameters()}
    allg = [None] * world; dist.all_gather_object(allg, (res, grads))
    if rank == 0:
        losses = [d["lm loss"].item() for r, _ in allg for d in r]
        loss = sum(losses) / len(losses); g = {k: v for _, gg in allg for k, v in gg.items()}
        print(f"PP={world} VPP={vpp} fb={fb.__name__} loss={loss:.8f} per-mb={[round(x,6) for x in losses]}")
        print("layer_numbers per rank/chunk:", [ [ [l.layer_number for l in c.decoder.layers] for c in chunks ] ])
        if world == 1: torch.save({"loss": loss, "grads": g}, f"{OUT}/vpp_ref.pt")
        else:
            r = torch.load(f"{OUT}/vpp_ref.pt")
            print(f"|loss diff|={abs(loss-r['loss']):.3e} max|grad diff|={max((g[k]-r['grads'][k]).abs().max().item() for k in g):.3e} over {len(g)} params")
    dist.barrier(); dist.destroy_process_group()
if __name__ == "__main__":
    w = int(sys.argv[1]); mp.spawn(worker, args=(w,), nprocs=w, join=True)

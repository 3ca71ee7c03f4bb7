# usage: ddp_opt_test.py WORLD {distopt|plain} [mode] [patch-level]
# DP=WORLD (TP=PP=1): megatron DDP + get_megatron_optimizer(adam, fp32, clip_grad=1.0), one step.
# WORLD=1 runs both microbatches locally and writes a reference; WORLD=2 gives one microbatch per rank and compares.
# patch-level: 'base' = cpu_patches.apply()+apply_pipeline() only; 'mode' = also CudaToCpuMode blanket shim.
import os, sys, datetime, traceback
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *
import torch, torch.distributed as dist, torch.multiprocessing as mp
OUT = "/tmp/mcore-scripts/out"
def worker(rank, world, dist_opt, level):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541")
    torch.set_num_threads(1)
    import cpu_patches
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    from megatron.core import parallel_state as ps, tensor_parallel
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.distributed import DistributedDataParallel as DDP, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import get_megatron_optimizer, OptimizerConfig
    cpu_patches.apply(); cpu_patches.apply_pipeline()
    mode = cpu_patches.CudaToCpuMode() if level == "mode" else None
    if mode: mode.__enter__()
    ps.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    bf16 = "bf16" in sys.argv
    cfg = qwen_like_config(**(dict(bf16=True) if bf16 else {}))
    if bf16: cfg.params_dtype = torch.bfloat16
    m = build_gpt(cfg)
    ref = torch.load(f"{OUT}/ref_sd.pt")
    with torch.no_grad():
        for n, p in m.named_parameters(): p.copy_(ref[n])
    if bf16:
        from megatron.core.transformer.module import Float16Module
        m.bfloat16(); m_inner = m; m = Float16Module(cfg, m_inner)
    stage = "DDP()"
    try:
        model = DDP(config=cfg, ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                    overlap_grad_reduce=False, use_distributed_optimizer=dist_opt), module=m)
        cfg.no_sync_func = model.no_sync; cfg.finalize_model_grads_func = finalize_model_grads
        stage = "get_megatron_optimizer()"
        opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, clip_grad=1.0,
                    use_distributed_optimizer=dist_opt, bf16=bf16, fp16=False), [model])
        stage = "forward_backward"
        mbs = [batch(seed=s) for s in (range(2) if world == 1 else [rank])]
        it = iter(mbs)
        def loss_func(o):
            l = o.float().mean(); return l, {"lm loss": l.detach().clone()}
        def fstep(di, mdl):
            ids, pos, mask = next(di); return mdl(ids, pos, mask, labels=ids), loss_func
        model.zero_grad_buffer(); opt.zero_grad()
        res = get_forward_backward_func()(forward_step_func=fstep, data_iterator=it, model=[model],
                num_microbatches=len(mbs), seq_length=16, micro_batch_size=2, forward_only=False)
        sq = sum((p.main_grad.float() ** 2).sum() for p in m.parameters())
        print("loss", float(sum(d["lm loss"] for d in res)/len(res)))
        if rank == 0: print(f"independent grad norm from rank0 main_grad (valid when grads are fully reduced, i.e. not distopt): {sq.sqrt().item():.6f}")
        stage = "optimizer.step()"
        ok, gnorm, nz = opt.step()
    except Exception as e:
        print(f"rank{rank} FAIL in {stage}: {type(e).__name__}: {str(e)[:250]}"); traceback.print_exc(limit=-3)
        print("patch hits:", sorted(cpu_patches.HITS)); sys.stdout.flush(); os._exit(1)
    if mode: mode.__exit__(None, None, None)
    params = {n: p.detach().clone() for n, p in m.named_parameters()}
    if rank == 0:
        print(f"DP={world} distopt={dist_opt} level={level} step ok={ok} grad_norm={float(gnorm):.6f}")
        key = f"{OUT}/ddp_ref.pt"
        if bf16: print("bf16 run (no reference compare)"); key = "/nonexistent"
        if world == 1 and not bf16: torch.save({"params": params, "gnorm": float(gnorm)}, key)
        elif os.path.exists(key):
            r = torch.load(key)
            print(f"|grad_norm diff|={abs(float(gnorm)-r['gnorm']):.3e} max|param diff after step|={max((params[k]-r['params'][k]).abs().max().item() for k in params):.3e}")
            print(f"max|param change from init|={max((params[k]-ref[k]).abs().max().item() for k in params):.3e}")
        print("patch hits:", sorted(cpu_patches.HITS))
    dist.barrier(); dist.destroy_process_group()
if __name__ == "__main__":
    world = int(sys.argv[1]); dist_opt = sys.argv[2] == "distopt"; level = sys.argv[3] if len(sys.argv) > 3 else "base"
    mp.spawn(worker, args=(world, dist_opt, level), nprocs=world, join=True)

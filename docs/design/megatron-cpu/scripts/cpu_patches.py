"""Minimal monkeypatches to run megatron-core 0.16.1 on a CPU-only torch build (gloo).
Each patch logs the first time it is hit so we can see which ones are really needed."""
import torch, functools, sys
HITS = set()
def _hit(name):
    import traceback
    fr = [f for f in traceback.extract_stack()[:-2] if "megatron" in f.filename]
    if fr:
        name = f"{name} <- {fr[-1].filename.split('site-packages/')[-1]}:{fr[-1].lineno}"
    if name not in HITS:
        HITS.add(name); print(f"[cpu_patches] hit: {name}", file=sys.stderr, flush=True)

def apply(cuda_device_shim=True):
    from megatron.core.tensor_parallel import random as mrand
    # (1) RNG tracker: megatron/core/tensor_parallel/random.py _get_cuda_rng_state (l.41),
    #     _set_cuda_rng_state (l.72), CudaRNGStatesTracker.add (l.235-238),
    #     model_parallel_cuda_manual_seed (l.422 torch.cuda.manual_seed)
    #     NB: do NOT patch torch.cuda.manual_seed_all -- torch.manual_seed calls it (infinite recursion)
    def _get(device="cuda", clone=False, graph_safe=False):
        _hit("rng:_get_cuda_rng_state"); s = torch.get_rng_state(); return s.clone() if clone else s
    def _set(new_state, device=-1, graph_safe=False):
        _hit("rng:_set_cuda_rng_state"); torch.set_rng_state(new_state)
    mrand._get_cuda_rng_state = _get
    mrand._set_cuda_rng_state = _set
    def _cuda_get_rng_state(device="cuda"):
        _hit("torch.cuda.get_rng_state"); return torch.get_rng_state()
    def _cuda_manual_seed(seed):
        _hit("torch.cuda.manual_seed"); torch.manual_seed(seed)
    torch.cuda.get_rng_state = _cuda_get_rng_state
    torch.cuda.manual_seed = _cuda_manual_seed
    if cuda_device_shim:
        # (2) torch.cuda.current_device(): used as `device=` for buffers
        #     (utils.py GlobalMemoryBuffer.get_tensor l.631, p2p_communication, param_and_grad_buffer, ...)
        def _cur():
            _hit("torch.cuda.current_device"); return torch.device("cpu")
        torch.cuda.current_device = _cur

def apply_pipeline():
    """Extra patches for pipeline_parallel (schedules + p2p) on CPU."""
    # (3) torch.cuda.synchronize(): p2p_communication.py l.242 / l.398 (batch_p2p_sync)
    def _sync(device=None):
        _hit("torch.cuda.synchronize")
    torch.cuda.synchronize = _sync
    # (4) literal device="cuda" in schedules.py l.596/983/2138 (total_num_tokens):
    #     give the schedules module a torch proxy whose zeros() maps cuda->cpu.
    import types
    from megatron.core.pipeline_parallel import schedules
    proxy = types.ModuleType("torch_cpu_proxy")
    proxy.__dict__.update({k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
    def _zeros(*a, **k):
        if str(k.get("device", "")).startswith("cuda"):
            _hit("schedules torch.zeros(device='cuda')"); k["device"] = "cpu"
        return torch.zeros(*a, **k)
    proxy.zeros = _zeros
    schedules.torch = proxy

from torch.overrides import TorchFunctionMode
class CudaToCpuMode(TorchFunctionMode):
    """Alternative blanket shim: rewrite device='cuda' and Tensor.cuda() to CPU for any torch call."""
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            _hit("Tensor.cuda()"); return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # megatron asserts/branches on param.type() == 'torch.cuda.FloatTensor' etc.
            t = func(*args)
            if t.startswith("torch.") and not t.startswith("torch.cuda."):
                _hit("Tensor.type() -> torch.cuda.*"); t = "torch.cuda." + t[len("torch."):]
            return t
        d = kwargs.get("device")
        if d is not None and (isinstance(d, int) or str(d).startswith("cuda")):
            _hit(f"device={d!r}"); kwargs["device"] = "cpu"
        return func(*args, **kwargs)

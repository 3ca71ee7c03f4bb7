"""Options of the built-in rollout engines (imports nothing heavy: read at plugin registration); the
keys every rollout section takes are the run's (:mod:`unirl.config.sections`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from unirl.config.sections import ROLLOUT_POLICY_KEYS, RolloutPolicy, split_rollout_policy
from unirl.userfiles import PathKind, path_field

LOGPROBS = ("raw", "processed")


@dataclass
class SamplingConfig:
    """The sampling knobs every built-in engine takes, with one meaning each (docs/semantics.md,
    "Sampling and rollout log-probs")."""

    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    min_p: float = 0.0  # 0: no min-p filter
    #: strings that end a completion; the token that completes one is its last (in the mask)
    stop: List[str] = field(default_factory=list)
    #: which log-probs the engine returns for its sampled tokens: ``raw`` (log-softmax of the model's
    #: logits, what the trainer computes) or ``processed`` (after temperature and the top-k/top-p/min-p
    #: filters, renormalised: biased as a behaviour policy, see semantics.md)
    logprobs: str = "raw"

    @staticmethod
    def validate(cfg: SamplingConfig) -> str | None:
        if cfg.max_new_tokens < 1:
            return f"max_new_tokens={cfg.max_new_tokens} must be >= 1."
        if cfg.temperature <= 0:
            return f"temperature={cfg.temperature} must be > 0 (sampling is required for GRPO groups)."
        if not 0 < cfg.top_p <= 1:
            return f"top_p={cfg.top_p} must be in (0, 1]."
        if cfg.top_k < 0:
            return f"top_k={cfg.top_k} must be >= 0 (0 disables it)."
        if not 0 <= cfg.min_p < 1:
            return f"min_p={cfg.min_p} must be in [0, 1) (0 disables it)."
        if any(not isinstance(x, str) or not x for x in cfg.stop):
            return f"stop={list(cfg.stop)!r}: give non-empty strings, e.g. stop=['\\n']."
        if cfg.logprobs not in LOGPROBS:
            return f"logprobs={cfg.logprobs!r}: use one of {', '.join(LOGPROBS)}."
        return None


def sampling_params(config: Any, n: int) -> Any:
    """The ``SamplingParams`` of an engine's ``rollout`` section (a :class:`SamplingConfig`), ``n`` per prompt."""
    from unirl.protocols import SamplingParams

    return SamplingParams(n=n, max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                          top_p=config.top_p, top_k=config.top_k, min_p=config.min_p, stop=list(config.stop),
                          logprob_kind=config.logprobs)


@dataclass
class HFGenerateConfig(SamplingConfig):
    pass


VERIFY_PUSH = ("changed", "off")
WEIGHT_TRANSPORTS = ("shm_file", "cuda_ipc")


@dataclass
class VLLMConfig(SamplingConfig):
    """``rollout.name=vllm`` (:mod:`unirl.rollouts.vllm_engine`, docs/rollouts.md)."""

    #: the vLLM environment's Python (``scripts/setup_vllm_env.sh``); null: ``$UNIRL_VLLM_PYTHON``, else
    #: the checkout's ``.venv-vllm``
    python: Optional[str] = path_field(PathKind.FILE, None, fix="Give the vLLM environment's python, made by "
                                       "`bash scripts/setup_vllm_env.sh` (.venv-vllm/bin/python).")
    dtype: Optional[str] = None  # null: model.dtype
    max_model_len: int = 0  # 0: the model's max_position_embeddings
    #: after each weight push, refuse one that left the engine's outputs unchanged while the pushed
    #: tensors differ from what it held (``changed``), or trust it (``off``)
    verify_push: str = "changed"
    #: how weights reach the engine: ``shm_file`` (a safetensors file on /dev/shm; CPU and GPU) or
    #: ``cuda_ipc`` (CUDA IPC handles of the trainer's GPU tensors; CUDA only, same GPU)
    weight_transport: str = "shm_file"
    threads: int = 0  # CPU: the worker's threads (0: run.threads, else this machine's cores)
    kv_cache_gib: float = 1.0  # CPU: VLLM_CPU_KVCACHE_SPACE
    gpu_memory_utilization: float = 0.5  # CUDA: the share of the GPU the engine takes
    startup_timeout_s: float = 600.0
    #: the longest one generate or weight push may take; a worker silent for longer is stopped and the
    #: run ends with an error quoting its log (resume continues from the last checkpoint)
    call_timeout_s: float = 1800.0

    @staticmethod
    def validate(cfg: VLLMConfig, recipe: Any = None) -> str | None:
        problem = SamplingConfig.validate(cfg)
        if problem:
            return problem
        tiny = recipe.model.tiny if recipe is not None and recipe.model.path is None else None
        if tiny is not None and tiny.hidden_size // tiny.num_heads < 32:
            return (f"vLLM's CPU attention needs a head size of at least 32, and the tiny model's is "
                    f"model.tiny.hidden_size/num_heads = {tiny.hidden_size}/{tiny.num_heads} = "
                    f"{tiny.hidden_size // tiny.num_heads}: set model.tiny.num_heads={max(1, tiny.hidden_size // 32)} "
                    f"and model.tiny.num_kv_heads=1 (configs/grpo_tiny_vllm.yaml does).")
        if cfg.weight_transport not in WEIGHT_TRANSPORTS:
            return f"weight_transport={cfg.weight_transport!r}: use one of {', '.join(WEIGHT_TRANSPORTS)}."
        if cfg.weight_transport == "cuda_ipc":
            import torch

            if not torch.cuda.is_available():
                return ("weight_transport='cuda_ipc' hands CUDA tensors to the engine by IPC handle, and no CUDA "
                        "device is visible here: use weight_transport=shm_file.")
        if cfg.temperature > 2:
            return f"temperature={cfg.temperature}: vLLM takes temperatures up to 2."
        if cfg.verify_push not in VERIFY_PUSH:
            return f"verify_push={cfg.verify_push!r}: use one of {', '.join(VERIFY_PUSH)}."
        if cfg.dtype not in (None, "float32", "bfloat16", "float16"):
            return f"dtype={cfg.dtype!r}: use float32, bfloat16, float16 or null (model.dtype)."
        if cfg.threads < 0 or cfg.kv_cache_gib <= 0 or cfg.startup_timeout_s <= 0 or cfg.call_timeout_s <= 0:
            return ("threads (>= 0; 0: run.threads), kv_cache_gib, startup_timeout_s and call_timeout_s (> 0) must "
                    "be positive.")
        if not 0 < cfg.gpu_memory_utilization <= 1:
            return f"gpu_memory_utilization={cfg.gpu_memory_utilization} must be in (0, 1]."
        from unirl.rollouts.vllm_env import find_python

        return find_python(cfg.python)[1]


@dataclass
class SGLangConfig(SamplingConfig):
    """``rollout.name=sglang``: registered so that a recipe naming it is refused before anything runs,
    with the reason (docs/rollouts.md)."""

    @staticmethod
    def validate(cfg: SGLangConfig) -> str | None:
        return SamplingConfig.validate(cfg) or sglang_refusal()


def sglang_refusal() -> str:
    """Why ``rollout.name=sglang`` does not run here (it runs nowhere yet: on GPUs
    ``scripts/gpu/sglang.sh`` measures SGLang alone)."""
    import torch

    if torch.cuda.is_available():
        return ("unirl has no SGLang engine yet: on this GPU, scripts/gpu/sglang.sh measures SGLang's generation "
                "and log-probs on their own; use rollout.name=vllm (or hf_generate) to train.")
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        flags = ""
    has_amx = "amx_tile" in flags
    return ("SGLang does not run on this machine: it generates on NVIDIA or AMD GPUs, and on CPUs only with Intel "
            "AMX (4th-generation Xeon or newer) and a source build of its CPU kernels (docs.sglang.io, CPU servers); "
            f"here there is no CUDA device and the CPU {'has' if has_amx else 'lacks'} AMX. Use rollout.name=vllm "
            "(vLLM's CPU build runs here) or hf_generate; scripts/gpu/sglang.sh measures SGLang on a GPU.")


__all__ = ["HFGenerateConfig", "SGLangConfig", "SamplingConfig", "VLLMConfig", "ROLLOUT_POLICY_KEYS", "RolloutPolicy", "split_rollout_policy"]

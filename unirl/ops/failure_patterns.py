"""What ``unirl diagnose`` recognises: one entry per failure class, data only.

Each pattern is a regular expression matched against each line of a log; the text it matches is the
message as the tool that writes it prints it (``source`` names where), and each is tested on a fixture
(tests/data/logs/CLASS.log) written in the format of a public report of it (``example``, the thread's
address). ``category`` tells host memory from GPU memory and hardware faults from software ones;
``symptom`` is "yes" for a message that is usually the consequence of another failure (a collective
timing out after a peer died, a launcher reporting a child's death): :func:`unirl.ops.diagnose.precedence`
puts first causes before symptoms. ``cause`` and ``fix`` are what the answer says.
"""

from __future__ import annotations

#: the categories, in the order a first cause is looked for among several (a hardware fault explains
#: the software errors it causes; running out of a resource explains what fails for want of it)
CATEGORIES = ("hardware", "host_memory", "gpu_memory", "disk", "scheduler", "configuration", "numerics", "software",
              "network", "distributed")

PATTERNS: list[dict[str, str]] = [
    # ---- the first classes (training, Slurm, Ray, NCCL)
    {"class": "nccl_timeout",
     "category": "distributed",
     "symptom": "yes",
     "pattern": r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=\d+, OpType=\w+",
     "source": "torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (the watchdog's timeout message)",
     "example": "https://github.com/OpenRLHF/OpenRLHF/issues/624",
     "cause": "a collective did not finish within the process group's timeout: one rank is stuck or much slower (a "
              "hang in data loading or the rollout, a dead peer, a mismatched collective), or the network stalled",
     "fix": "find the rank that did not reach the collective (NCCL_DEBUG=INFO, TORCH_DISTRIBUTED_DEBUG=DETAIL, py-spy "
            "dump on each rank); raise the timeout only once a slow rank is the cause"},
    {"class": "nccl_error",
     "category": "distributed",
     "symptom": "yes",
     "pattern": r"NCCL error in: .*ProcessGroupNCCL\.cpp|nccl(Internal|UnhandledCuda|System|Remote|InvalidUsage)Error",
     "source": "torch/csrc/distributed/c10d/NCCLUtils.hpp (C10D_NCCL_CHECK) and NCCL's ncclResult_t names",
     "example": "https://github.com/NVIDIA/nccl/issues/1016",
     "cause": "NCCL failed: a network or InfiniBand problem, a peer that died, mismatched NCCL versions, or a CUDA "
              "error inside a collective",
     "fix": "rerun with NCCL_DEBUG=INFO to see the failing transport; check every node runs the same torch/NCCL build "
            "and that NCCL_SOCKET_IFNAME / NCCL_IB_HCA name the right interfaces"},
    {"class": "cuda_oom",
     "category": "gpu_memory",
     "symptom": "no",
     "pattern": r"(torch\.OutOfMemoryError|torch\.cuda\.OutOfMemoryError|RuntimeError): CUDA out of memory\. Tried to "
                "allocate",
     "source": "c10/cuda/CUDACachingAllocator.cpp (the allocator's out-of-memory message)",
     "example": "https://github.com/zihaosheng/VLM-RL/issues/12",
     "cause": "a GPU ran out of memory: the micro-batch, sequence length, model or rollout engine's share is too large",
     "fix": "lower trainer.micro_batch_size or set trainer.max_tokens_per_micro_batch, shorten "
            "rollout.max_new_tokens, give vLLM a smaller share (rollout.gpu_memory_utilization), shard more "
            "(parallel.zero_stage=3, tp); PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True when "
            "reserved-but-unallocated memory is large"},
    {"class": "cuda_illegal_memory_access",
     "category": "software",
     "symptom": "no",
     "pattern": "CUDA error: an illegal memory access was encountered",
     "source": "the CUDA runtime's cudaErrorIllegalAddress, as torch's C10_CUDA_CHECK prints it",
     "example": "https://github.com/verl-project/verl/issues/421",
     "cause": "a kernel read or wrote out of bounds (an index past a tensor's end, a kernel bug, bad hardware); the "
              "error surfaces at a later call, not where it happened",
     "fix": "rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; check token ids against the vocabulary size; "
            "compute-sanitizer on a small reproduction"},
    {"class": "ray_actor_died",
     "category": "distributed",
     "symptom": "yes",
     "pattern": "ActorDiedError|The actor died unexpectedly before finishing this task",
     "source": "ray/exceptions.py: ActorDiedError.BASE_ERROR_MSG",
     "example": "https://github.com/hiyouga/EasyR1/issues/324",
     "cause": "a Ray actor (a rollout or reward worker) died: killed for memory by Ray's memory monitor or the OS, or "
              "it crashed",
     "fix": "read the actor's own log (ray logs / /tmp/ray/session_latest/logs, worker-*.err) for its last error; for "
            "memory, fewer workers per node or more memory per worker"},
    {"class": "ray_object_store_full",
     "category": "host_memory",
     "symptom": "no",
     "pattern": r"ObjectStoreFullError|The local object store is full of objects|Spilled \d+ MiB, \d+ objects",
     "source": "ray/exceptions.py: ObjectStoreFullError; ray/_private/internal_api.py (spill statistics)",
     "example": "https://github.com/ray-project/ray/issues/13443",
     "cause": "Ray's object store is full: objects kept in scope (batches, weights) pile up and spill to disk",
     "fix": "drop references to old batches; fewer in-flight batches (rollout.max_staleness); a larger object store "
            "(ray start --object-store-memory)"},
    {"class": "no_space_left",
     "category": "disk",
     "symptom": "no",
     "pattern": r"\[Errno 28\] No space left on device",
     "source": "the OS's ENOSPC, as Python's OSError prints it",
     "example": "https://github.com/NVIDIA/Megatron-LM/issues/878",
     "cause": "a disk is full: checkpoints, exports or caches in the run directory or /tmp",
     "fix": "free space or point run.dir at a larger disk; checkpoint.keep bounds the checkpoints kept"},
    {"class": "stale_file_handle",
     "category": "disk",
     "symptom": "no",
     "pattern": r"\[Errno 116\] Stale file handle",
     "source": "the OS's ESTALE, as Python's OSError prints it",
     "example": "https://github.com/huggingface/transformers/issues/9732",
     "cause": "a network file system (NFS) file was replaced or removed on another node while this one held it",
     "fix": "keep run directories and caches on a local disk or one writer per file; retry the read"},
    {"class": "nan_loss",
     "category": "numerics",
     "symptom": "no",
     "pattern": r"gradient norm is (nan|inf|-inf)|loss (is|=) nan|non-finite (loss|gradient)|\bgrad_norm:\s*(nan|"
                r"inf)\b|Loss became infinite or NaN",
     "source": "unirl's own step (unirl/engine/reference_trainer.py, unirl/engine/deepspeed.py: FloatingPointError); "
               "verl's step line (actor/grad_norm:nan); detectron2-style FloatingPointError",
     "example": "https://github.com/verl-project/verl/issues/2505",
     "cause": "a loss or gradient became NaN or infinite: a learning rate too high, a reward or advantage blow-up, "
              "16-bit overflow",
     "fix": "lower trainer.lr, set trainer.grad_clip, check the rewards' range (reward_range), train in float32 or "
            "bfloat16 rather than float16"},
    {"class": "slurm_preempted",
     "category": "scheduler",
     "symptom": "no",
     "pattern": r"\*\*\* (JOB|STEP) [\d.]+ ON \S+ CANCELLED AT \S+ DUE TO PREEMPTION \*\*\*",
     "source": "slurmstepd's cancellation message (src/slurmd/slurmstepd/req.c)",
     "example": "https://github.com/SystemsGenetics/GEMmaker/pull/242",
     "cause": "Slurm preempted the job for a higher-priority one",
     "fix": "resubmit with resume=auto (the newest checkpoint is kept); sbatch --requeue makes Slurm do it"},
    {"class": "slurm_time_limit",
     "category": "scheduler",
     "symptom": "no",
     "pattern": r"\*\*\* (JOB|STEP) [\d.]+ ON \S+ CANCELLED AT \S+ DUE TO TIME LIMIT \*\*\*",
     "source": "slurmstepd's cancellation message (src/slurmd/slurmstepd/req.c)",
     "example": "https://github.com/marbl/canu/issues/1052",
     "cause": "the job reached its time limit",
     "fix": "resubmit with resume=auto and a longer --time, or checkpoint more often (checkpoint.every)"},
    {"class": "oom_killed",
     "category": "host_memory",
     "symptom": "no",
     "pattern": r"Detected \d+ oom[-_]kill event|Out of memory: Killed process \d+|oom-kill:constraint=",
     "source": "slurmstepd (task/cgroup) and the Linux kernel's OOM killer (dmesg)",
     "example": "https://github.com/nextflow-io/nextflow/issues/5932",
     "cause": "the host ran out of CPU memory and the kernel killed a process",
     "fix": "fewer processes per node (reward workers, rollout workers), smaller batches, parallel.offload=none, or "
            "more memory per job (--mem)"},
    {"class": "connection_refused",
     "category": "network",
     "symptom": "yes",
     "pattern": r"ConnectionRefusedError|\[Errno 111\] Connection refused|Connection refused",
     "source": "the OS's ECONNREFUSED, as Python and gRPC print it",
     "example": "https://github.com/axolotl-ai-cloud/axolotl/issues/2528",
     "cause": "nothing listens at the address: the server (reward service, vLLM server, Ray head, rendezvous) is not "
              "up yet or died",
     "fix": "check the address and port, that the server started, and firewalls between the nodes"},
    {"class": "connection_timed_out",
     "category": "network",
     "symptom": "yes",
     "pattern": r"\[Errno 110\] Connection timed out|TimeoutError: timed out|The client socket has timed out",
     "source": "the OS's ETIMEDOUT as Python prints it; torch's TCPStore (torch/csrc/distributed/c10d/TCPStore.cpp)",
     "example": "https://github.com/huggingface/trl/issues/4538",
     "cause": "a peer did not answer in time: a wrong address, a firewall, or the other side is overloaded",
     "fix": "check MASTER_ADDR / the rendezvous endpoint is reachable from every node (nc -zv host port)"},
    {"class": "rank_mismatch",
     "category": "distributed",
     "symptom": "no",
     "pattern": "Detected mismatch between collectives on ranks",
     "source": "torch/csrc/distributed/c10d/ProcessGroupWrapper.cpp (TORCH_DISTRIBUTED_DEBUG=DETAIL)",
     "example": "https://github.com/Lightning-AI/pytorch-lightning/issues/19106",
     "cause": "ranks called different collectives (or shapes) in the same position: ranks took different code paths",
     "fix": "make every rank run the same steps (equal batch shares: parallel.dp divides the batch; the same "
            "micro-batch counts)"},
    # ---- GPU, CUDA, NCCL and hardware
    {"class": "gpu_xid_ecc",
     "category": "hardware",
     "symptom": "no",
     "pattern": r"NVRM: Xid \(PCI:[0-9A-Fa-f:.]+\): (48|94|95),",
     "source": "the NVIDIA driver (dmesg / kernel log, NVRM: Xid 48 DBE, 94/95 contained/uncontained ECC)",
     "example": "https://github.com/NVIDIA/gpu-operator/issues/1146",
     "cause": "the GPU's memory had an uncorrectable (double-bit) ECC error; the driver killed the work on that GPU "
              "and may retire or remap the bad page",
     "fix": "drain the node and reset the GPU (nvidia-smi -r, or reboot) so row remapping / page retirement takes "
            "effect; check nvidia-smi -q -d ECC,ROW_REMAPPER and replace the GPU if errors recur; then resubmit with "
            "resume=auto"},
    {"class": "gpu_fell_off_bus",
     "category": "hardware",
     "symptom": "no",
     "pattern": r"NVRM: Xid \(PCI:[0-9A-Fa-f:.]+\): 79,|GPU has fallen off the bus|has fallen off the bus and is not "
                "responding",
     "source": "the NVIDIA driver (dmesg / kernel log, NVRM: Xid 79)",
     "example": "https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1151",
     "cause": "the GPU stopped answering on PCIe (power, thermal, riser/slot or firmware fault); every process on it "
              "fails",
     "fix": "take the node out of the pool and reboot it (a GPU reset is rarely enough); check power, temperatures "
            "and PCIe seating, update the driver/SBIOS; resubmit elsewhere with resume=auto"},
    {"class": "cuda_uncorrectable_ecc",
     "category": "hardware",
     "symptom": "no",
     "pattern": "uncorrectable ECC error encountered|CUDA_ERROR_ECC_UNCORRECTABLE|cudaErrorECCUncorrectable",
     "source": "the CUDA runtime's cudaErrorECCUncorrectable (214), as torch's C10_CUDA_CHECK prints it",
     "example": "https://github.com/zai-org/ChatGLM3/issues/681",
     "cause": "the GPU reported an uncorrectable ECC memory error to the CUDA runtime (dmesg shows Xid 48/94/95); the "
              "GPU's contexts are corrupt",
     "fix": "reset the GPU or reboot the node before reuse (nvidia-smi -r), check nvidia-smi -q -d ECC for a failing "
            "GPU and exclude it; resubmit with resume=auto"},
    {"class": "cuda_device_side_assert",
     "category": "software",
     "symptom": "no",
     "pattern": r"CUDA error: device-side assert triggered|\.cu:\d+: \w+: block: \[\d+,\d+,\d+\], thread: "
                r"\[\d+,\d+,\d+\] Assertion .* failed",
     "source": "CUDA_KERNEL_ASSERT in aten/src/ATen/native/cuda/*.cu, then cudaErrorAssert via torch's C10_CUDA_CHECK",
     "example": "https://github.com/huggingface/trl/issues/1995",
     "cause": "a CUDA kernel's bounds check failed, most often a token id >= the embedding/vocabulary size (tokenizer "
              "and model mismatch, added special tokens) or a label index out of range",
     "fix": "check token ids against the model's vocab size (resize embeddings after adding tokens; same tokenizer "
            "for rollout and trainer, model.path); rerun with CUDA_LAUNCH_BLOCKING=1 to locate the kernel"},
    {"class": "cuda_driver_too_old",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"The NVIDIA driver on your system is too old \(found version \d+\)|CUDA driver version is "
                "insufficient for CUDA runtime version",
     "source": "c10/cuda/CUDAFunctions.cpp (torch's driver check); the CUDA runtime's cudaErrorInsufficientDriver (35)",
     "example": "https://github.com/IEIT-Yuan/Yuan-2.0/issues/65",
     "cause": "the installed NVIDIA driver supports an older CUDA than the one torch/vLLM was built with",
     "fix": "upgrade the node's driver (nvidia-smi shows the highest CUDA it supports) or install a torch/vLLM wheel "
            "built for that CUDA (e.g. +cu118); in containers, the host driver is what counts (cuda-compat for "
            "datacenter GPUs)"},
    {"class": "no_cuda_gpus",
     "category": "configuration",
     "symptom": "no",
     "pattern": "RuntimeError: No CUDA GPUs are available|Found no NVIDIA driver on your system",
     "source": "c10/cuda/CUDAFunctions.cpp via torch/cuda/__init__.py _lazy_init (cudaErrorNoDevice / no driver)",
     "example": "https://github.com/ray-project/ray/issues/37225",
     "cause": "the process sees no GPU: CUDA_VISIBLE_DEVICES is empty or wrong, a Ray actor/task was started without "
              "num_gpus, the container lacks --gpus, or no driver is loaded",
     "fix": "check nvidia-smi and CUDA_VISIBLE_DEVICES inside the failing process; give Ray workers GPUs (num_gpus, "
            "placement groups) and do not overwrite CUDA_VISIBLE_DEVICES; run containers with --gpus all"},
    {"class": "cublas_failure",
     "category": "software",
     "symptom": "no",
     "pattern": "CUBLAS_STATUS_(EXECUTION_FAILED|INTERNAL_ERROR|ALLOC_FAILED|NOT_INITIALIZED|INVALID_VALUE|"
                "NOT_SUPPORTED|ARCH_MISMATCH|MAPPING_ERROR|LICENSE_ERROR)",
     "source": "aten/src/ATen/cuda/CUDABlas.cpp (TORCH_CUDABLAS_CHECK) and cuBLAS's cublasStatus_t names",
     "example": "https://github.com/VHellendoorn/Code-LMs/issues/31",
     "cause": "a cuBLAS GEMM failed: mismatched CUDA/cuBLAS libraries for this GPU, a dtype the GPU lacks (bf16 on "
              "pre-Ampere), out-of-range inputs from an earlier bug, or GPU memory exhaustion (ALLOC_FAILED / "
              "NOT_INITIALIZED)",
     "fix": "rerun with CUDA_LAUNCH_BLOCKING=1 to find the op; make torch's CUDA build match the driver/GPU (no mixed "
            "nvidia-cublas wheels); use model.dtype=float16/float32 on pre-Ampere GPUs; for ALLOC_FAILED treat as OOM "
            "(smaller trainer.micro_batch_size, lower rollout.gpu_memory_utilization)"},
    {"class": "nccl_duplicate_gpu",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"Duplicate GPU detected : rank \d+ and rank \d+ both on CUDA device",
     "source": 'NCCL src/init.cc (WARN "Duplicate GPU detected", returns ncclInvalidUsage)',
     "example": "https://github.com/verl-project/verl/issues/161",
     "cause": "two ranks of one NCCL communicator were placed on the same GPU: every process uses cuda:0 (no "
              "torch.cuda.set_device(local_rank)), CUDA_VISIBLE_DEVICES set the same for all ranks, or Ray packed "
              "workers",
     "fix": "set the device from LOCAL_RANK before init_process_group; launch no more ranks per node than GPUs "
            "(parallel.dp * parallel.tp * parallel.pp = GPUs); don't hard-code CUDA_VISIBLE_DEVICES per rank; upgrade "
            "Ray if its GPU assignment is wrong"},
    {"class": "flash_attn_undefined_symbol",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"flash_attn\w*_cuda\S*\.(so|pyd): undefined symbol",
     "source": "the dynamic loader (ImportError when importing flash-attn's compiled flash_attn_2_cuda extension)",
     "example": "https://github.com/Dao-AILab/flash-attention/issues/1612",
     "cause": "the flash-attn wheel was built against a different torch version / C++ ABI / CUDA than the installed "
              "torch",
     "fix": "reinstall flash-attn matching torch: pip uninstall flash-attn; pip install flash-attn "
            "--no-build-isolation (or the prebuilt wheel whose name matches torch X.Y, cuXXX and cxx11abiTRUE/FALSE); "
            "or disable flash attention"},
    {"class": "triton_out_of_resources",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"OutOfResources: out of resource: [\w ]+, Required: \d+, Hardware limit: \d+",
     "source": "triton/compiler/compiler.py (_init_handles raises triton.runtime.errors.OutOfResources)",
     "example": "https://github.com/Yuliang-Liu/MonkeyOCR/issues/86",
     "cause": "a Triton kernel's block sizes / num_stages were tuned for a GPU with more shared memory (A100/H100) "
              "than this one (consumer or older GPUs), or a head dim too large for the kernel",
     "fix": "run on a GPU the kernel supports, upgrade the library (vLLM, liger, mamba) whose kernel it is, or lower "
            "the kernel's BLOCK sizes / num_stages; switch the attention backend (VLLM_ATTENTION_BACKEND) if it is "
            "attention"},
    {"class": "cudnn_error",
     "category": "software",
     "symptom": "no",
     "pattern": "CUDNN_STATUS_(?!SUCCESS)[A-Z_]+",
     "source": "aten/src/ATen/cudnn/Exceptions.h (AT_CUDNN_CHECK) and cuDNN's cudnnStatus_t names",
     "example": "https://github.com/yassouali/pytorch-segmentation/issues/77",
     "cause": "a cuDNN call failed: out of GPU memory for its workspace, a cuDNN library mismatched with torch/CUDA, "
              "or an unsupported configuration",
     "fix": "check GPU memory (smaller trainer.micro_batch_size); use the cuDNN that ships with the torch wheel (no "
            "system libcudnn on LD_LIBRARY_PATH); try torch.backends.cudnn.benchmark=False or disabling cuDNN to "
            "confirm"},
    {"class": "cuda_launch_failure",
     "category": "software",
     "symptom": "no",
     "pattern": "unspecified launch failure",
     "source": "the CUDA runtime's cudaErrorLaunchFailure (719), as torch's C10_CUDA_CHECK prints it",
     "example": "https://github.com/pytorch/pytorch/issues/49832",
     "cause": "a kernel crashed on the GPU (out-of-bounds access in a custom kernel, a watchdog timeout) or the GPU "
              "faulted (dmesg shows Xid 13/31/43/79 then)",
     "fix": "check dmesg for NVRM Xid lines (hardware: drain the node); otherwise rerun with CUDA_LAUNCH_BLOCKING=1 "
            "and compute-sanitizer on a small reproduction; update the driver and the library owning the kernel"},
    {"class": "bf16_not_supported",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"[Bb]float16 is only supported on GPUs with compute capability|[Bb]f16 is only supported on A100\+ "
                "GPUs|Current CUDA Device does not support bfloat16",
     "source": "vllm/worker/worker.py _check_if_gpu_supports_dtype (vllm/platforms/cuda.py); xformers; torch.autocast",
     "example": "https://github.com/verl-project/verl/issues/2594",
     "cause": "bfloat16 was requested on a GPU older than Ampere (V100, T4, RTX 20xx: compute capability < 8.0)",
     "fix": "set model.dtype=float16 (or float32) and the rollout engine's dtype to half (vLLM --dtype=half); or run "
            "on Ampere or newer GPUs"},
    {"class": "gpu_busy_or_unavailable",
     "category": "hardware",
     "symptom": "no",
     "pattern": r"CUDA-capable device\(s\) is/are busy or unavailable|all CUDA-capable devices are busy or unavailable",
     "source": "the CUDA runtime's cudaErrorDevicesUnavailable (46), as torch's C10_CUDA_CHECK prints it",
     "example": "https://github.com/Tencent-Hunyuan/InstantCharacter/issues/21",
     "cause": "the GPU could not be opened: it is in Exclusive_Process compute mode and another process holds it, or "
              "it is in a failed state after an Xid and needs a reset",
     "fix": "check nvidia-smi for other processes and the compute mode (nvidia-smi -q -d COMPUTE; set Default with "
            "nvidia-smi -c 0); if none, check dmesg for Xid and reset the GPU or drain the node"},
    {"class": "cuda_no_kernel_image",
     "category": "configuration",
     "symptom": "no",
     "pattern": "no kernel image is available for execution on the device|cudaErrorNoKernelImageForDevice",
     "source": "the CUDA runtime's cudaErrorNoKernelImageForDevice (209), as torch's C10_CUDA_CHECK prints it",
     "example": "https://github.com/zai-org/CodeGeeX/issues/118",
     "cause": "torch or an extension (flash-attn, vLLM, custom ops) was compiled without this GPU's architecture "
              "(e.g. no sm_90 for H100, no sm_120 for RTX 50xx, or too new for an old GPU)",
     "fix": "install wheels built for this GPU (a newer torch/CUDA for new GPUs), or rebuild extensions with "
            "TORCH_CUDA_ARCH_LIST set to the GPU's compute capability"},
    {"class": "cuda_fork_reinit",
     "category": "configuration",
     "symptom": "no",
     "pattern": "Cannot re-initialize CUDA in forked subprocess",
     "source": "torch/cuda/__init__.py (_lazy_init)",
     "example": "https://github.com/vllm-project/vllm/issues/7077",
     "cause": "CUDA was initialised in the parent process and then a worker was started with fork (vLLM workers, "
              "DataLoader workers, multiprocessing pools)",
     "fix": "use the spawn start method: VLLM_WORKER_MULTIPROC_METHOD=spawn, "
            "multiprocessing.set_start_method('spawn'); don't touch CUDA (torch.cuda.*) before starting workers"},
    {"class": "flash_attn_unsupported_gpu",
     "category": "configuration",
     "symptom": "no",
     "pattern": "FlashAttention only supports Ampere GPUs or newer",
     "source": "flash-attention csrc/flash_attn/flash_api.cpp (mha_fwd TORCH_CHECK)",
     "example": "https://github.com/vllm-project/vllm/issues/8189",
     "cause": "FlashAttention-2 was used on a pre-Ampere GPU (V100, T4, RTX 20xx)",
     "fix": "use another attention implementation: attn_implementation='sdpa' or 'eager' in the trainer, "
            "VLLM_ATTENTION_BACKEND=XFORMERS for vLLM; or run on Ampere or newer GPUs"},
    {"class": "cuda_invalid_device_ordinal",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"CUDA error: invalid device ordinal|cuda runtime error \(101\) : invalid device ordinal",
     "source": "the CUDA runtime's cudaErrorInvalidDevice (101), as torch's C10_CUDA_CHECK prints it",
     "example": "https://github.com/OpenBMB/MiniCPM-V/issues/356",
     "cause": "a process asked for a GPU index beyond the visible ones: more ranks per node than GPUs, or "
              "CUDA_VISIBLE_DEVICES narrower than --nproc_per_node / the device ids in the config",
     "fix": "launch as many ranks per node as visible GPUs (nproc_per_node = len(CUDA_VISIBLE_DEVICES); parallel.dp * "
            "parallel.tp * parallel.pp = GPUs); use cuda:LOCAL_RANK, not global rank"},
    # ---- launchers, clusters and host resources
    {"class": "k8s_oom_killed",
     "category": "host_memory",
     "symptom": "no",
     "pattern": r"Reason:\s+OOMKilled\b|\b\d+/\d+\s+OOMKilled\s|\breason: OOMKilled\b",
     "source": "the kubelet / container runtime (kubectl describe pod: Last State Terminated, Reason OOMKilled, Exit "
               "Code 137)",
     "example": "https://github.com/gimlet-io/gimlet/issues/649",
     "cause": "the container went over its memory limit (resources.limits.memory) and the kernel's cgroup OOM killer "
              "killed it (exit code 137)",
     "fix": "raise the pod's memory request/limit, or use less host memory: fewer rollout.workers or reward workers "
            "per pod, smaller trainer.micro_batch_size, parallel.offload=none (CPU offload lives in host memory); "
            "check /dev/shm is an emptyDir(medium: Memory) counted in the limit"},
    {"class": "k8s_evicted",
     "category": "scheduler",
     "symptom": "no",
     "pattern": r"The node was low on resource: \[?[\w.-]+\]?\.|The node had condition: \[(DiskPressure|MemoryPressure|"
                r"PIDPressure)\]",
     "source": "the kubelet's eviction manager (pkg/kubelet/eviction/helpers.go: 'The node was low on resource: %v.')",
     "example": "https://github.com/kubernetes/kubernetes/issues/91600",
     "cause": "the kubelet evicted the pod because the node ran short of ephemeral-storage (container logs, writable "
              "layer, emptyDir) or memory, and this pod used more than it requested",
     "fix": "set resources.requests for ephemeral-storage/memory close to real use; put run.dir, checkpoints and "
            "caches (HF_HOME, /tmp) on a PersistentVolume rather than the container filesystem; lower checkpoint.keep"},
    {"class": "k8s_pod_unschedulable",
     "category": "scheduler",
     "symptom": "no",
     "pattern": r"FailedScheduling\s.*\d+/\d+ nodes are available|\b0/\d+ nodes are available: .*(Insufficient|"
                r"node\(s\))",
     "source": "kube-scheduler (FailedScheduling event; noderesources fit plugin: 'Insufficient nvidia.com/gpu')",
     "example": "https://github.com/NVIDIA/k8s-device-plugin/issues/119",
     "cause": "no node can take the pod: it asks for more GPUs/CPU/memory than any node has free (or the NVIDIA "
              "device plugin does not advertise nvidia.com/gpu), or taints/selectors exclude the nodes",
     "fix": "request what one node has (GPUs per pod = parallel.tp x local ranks), free GPUs held by old pods, check "
            "'kubectl describe node' shows nvidia.com/gpu allocatable (device plugin running), fix "
            "nodeSelector/tolerations"},
    {"class": "torchrun_child_sigkill",
     "category": "host_memory",
     "symptom": "yes",
     "pattern": r"exitcode\s*: -9 \(pid: \d+\)|Signal 9 \(SIGKILL\) received by PID \d+|failed \(exitcode: -9\) "
                r"local_rank: \d+",
     "source": "torch/distributed/elastic/multiprocessing/api.py and errors/__init__.py (ChildFailedError, "
               "ProcessFailure)",
     "example": "https://github.com/lzhxmu/CPPO/issues/6",
     "cause": "a training rank was killed with SIGKILL from outside: most often the host's OOM killer (CPU RAM), "
              "otherwise a scheduler/preemption kill; the rank itself printed no error",
     "fix": "check dmesg / the scheduler log for an OOM kill; use less host memory per node (fewer ranks or "
            "rollout.workers, parallel.offload=none or optimizer instead of all, smaller trainer.micro_batch_size, "
            "load checkpoints shard by shard) or ask for more memory (--mem / pod limits)"},
    {"class": "torchrun_child_segfault",
     "category": "software",
     "symptom": "no",
     "pattern": r"exitcode\s*: -11 \(pid: \d+\)|Signal 11 \(SIGSEGV\) received by PID \d+|failed \(exitcode: -11\) "
                r"local_rank: \d+",
     "source": "torch/distributed/elastic/multiprocessing/api.py and errors/__init__.py (ChildFailedError, "
               "ProcessFailure)",
     "example": "https://github.com/NVIDIA/Megatron-LM/issues/1880",
     "cause": "a training rank crashed with a segmentation fault in native code (a CUDA/NCCL/extension library, "
              "mismatched compiled extensions, or a DataLoader worker library)",
     "fix": "rerun with PYTHONFAULTHANDLER=1 (and TORCH_SHOW_CPP_STACKTRACES=1) to get the crashing frame; rebuild "
            "compiled extensions (flash-attn, apex, transformer-engine) against the installed torch/CUDA; try "
            "DataLoader num_workers=0"},
    {"class": "torchrun_child_failed",
     "category": "distributed",
     "symptom": "yes",
     "pattern": r"exitcode\s*: [1-9]\d* \(pid: \d+\)|failed \(exitcode: [1-9]\d*\) local_rank: \d+",
     "source": "torch/distributed/elastic/multiprocessing/api.py and errors/__init__.py (ChildFailedError summary)",
     "example": "https://github.com/CVMI-Lab/PLA/issues/18",
     "cause": "a training rank exited with an error; the ChildFailedError summary only reports the exit code, the "
              "real error is the traceback the rank printed earlier",
     "fix": "scroll up to the first rank's traceback (search for 'Traceback' / '[rank0]:'); decorate main() with "
            "torch.distributed.elastic.multiprocessing.errors.record to get it in error_file"},
    {"class": "ray_node_oom",
     "category": "host_memory",
     "symptom": "no",
     "pattern": r"Task was killed due to the node running low on memory|Workers \(tasks / actors\) killed due to "
                r"memory pressure \(OOM\)",
     "source": "Ray's memory monitor (src/ray/raylet/node_manager.cc), raised as ray.exceptions.OutOfMemoryError",
     "example": "https://github.com/real-stanford/flingbot/issues/11",
     "cause": "the node's host memory crossed Ray's usage threshold (RAY_memory_usage_threshold, 0.95) and Ray killed "
              "the most recently scheduled worker",
     "fix": "use less host memory per node: fewer rollout.workers / reward workers, more CPUs per task so fewer run "
            "at once (distributed.ray.num_cpus), parallel.offload=none, smaller batches; or add memory. Raising "
            "RAY_memory_usage_threshold only moves the kill to the kernel OOM killer"},
    {"class": "ray_node_died",
     "category": "distributed",
     "symptom": "yes",
     "pattern": "has been marked dead because the detector has missed too many heartbeats|node manager has mistakenly "
                "been marked (as )?dead",
     "source": "Ray GCS health check (src/ray/gcs/gcs_server/gcs_node_manager.cc), printed by ray/_private/worker.py",
     "example": "https://github.com/ray-project/ray/issues/44680",
     "cause": "a Ray node (its raylet) stopped answering health checks: it crashed or was OOM-killed, the machine was "
              "preempted, or it was too overloaded / the network too slow to answer in time",
     "fix": "read raylet.out / dmesg on the dead node for an OOM kill or crash; leave headroom for the raylet (fewer "
            "workers per node, distributed.ray.num_cpus below the core count); raise RAY_health_check_timeout_ms / "
            "RAY_health_check_failure_threshold only for a slow network; resume=auto after replacing the node"},
    {"class": "ray_gcs_connection",
     "category": "network",
     "symptom": "no",
     "pattern": r"Failed to connect to GCS at address \S* ?within \d+ seconds|Failed to get cluster ID from GCS server|"
                r"Failed to connect to GCS within \d+ seconds|Unable to connect to GCS at",
     "source": "Ray's GCS client (src/ray/rpc/gcs_server/gcs_rpc_client.h, src/ray/gcs/gcs_client/gcs_client.cc)",
     "example": "https://github.com/Jiayi-Pan/TinyZero/issues/75",
     "cause": "the process could not reach the Ray head's GCS at the given address: the head is not started (or "
              "died), the address/port is wrong or empty, a firewall blocks it, or the Ray versions differ",
     "fix": "start the head first (ray start --head --port=6379) and pass its reachable IP:port (not 127.0.0.1 across "
            "nodes); 'ray stop' stale clusters; same ray version on every node; open the GCS port between nodes"},
    {"class": "ray_unschedulable",
     "category": "scheduler",
     "symptom": "no",
     "pattern": "The following resource request cannot be scheduled right now|No available node types can fulfill "
                r"resource request|The actor or task with ID \w+ cannot be scheduled right now",
     "source": "Ray autoscaler/monitor (python/ray/autoscaler/_private/autoscaler.py) and ray/_private/worker.py",
     "example": "https://github.com/OpenRLHF/OpenRLHF/issues/516",
     "cause": "an actor, task or placement group asks for more GPUs/CPUs than the Ray cluster has free, so it stays "
              "pending (usually all GPUs are already held by other actors, or a node never joined)",
     "fix": "check 'ray status': make the requested GPUs (parallel.dp x parallel.tp x parallel.pp plus rollout "
            "engines) fit the cluster, colocate models or lower rollout.workers, and give Ray the CPUs the actors "
            "request (distributed.ray.num_cpus); make sure every node joined"},
    {"class": "ray_worker_crashed",
     "category": "distributed",
     "symptom": "yes",
     "pattern": "A worker died or was killed while executing (a|the) task|WorkerCrashedError: The worker died "
                "unexpectedly while executing this task",
     "source": "the raylet (src/ray/raylet/node_manager.cc), raised to the caller as ray.exceptions.WorkerCrashedError",
     "example": "https://github.com/ray-project/ray/issues/31398",
     "cause": "the worker process running a Ray task died without a Python error: killed by the OOM killer (SIGKILL), "
              "'ray stop --force', or a native crash (SIGSEGV)",
     "fix": "read the dead worker's log (/tmp/ray/session_latest/logs/worker-<id>*.err) and dmesg; for memory, fewer "
            "workers per node or more memory; for a crash, the native library's stack"},
    {"class": "address_in_use",
     "category": "network",
     "symptom": "no",
     "pattern": r"errno: 98 - Address already in use|\[Errno 98\] Address already in use|name: EADDRINUSE",
     "source": "torch/csrc/distributed/c10d/socket.cpp (TCPStore server bind, errno 98 EADDRINUSE)",
     "example": "https://github.com/hao-ai-lab/FastVideo/issues/575",
     "cause": "the rendezvous port (MASTER_PORT, default 29500) is already taken: another job or a leftover process "
              "from a crashed run on the same node is listening on it",
     "fix": "give each job its own port (torchrun --master_port / MASTER_PORT, or --rdzv-endpoint host:0 for a free "
            "one); kill the leftover process (ss -ltnp | grep 29500)"},
    {"class": "rendezvous_timeout",
     "category": "distributed",
     "symptom": "yes",
     "pattern": r"RendezvousTimeoutError|Timed out after \d+ seconds waiting for (clients|workers)\. \d+/\d+ (clients|"
                "workers) joined",
     "source": "torch/csrc/distributed/c10d/TCPStore.cpp (DistStoreError) and "
               "torch/distributed/elastic/rendezvous/dynamic_rendezvous.py",
     "example": "https://github.com/OpenRLHF/OpenRLHF/issues/1040",
     "cause": "not every rank/node joined the rendezvous within the timeout: the other processes never started, "
              "crashed before joining, point at a different MASTER_ADDR/port, or cannot reach it",
     "fix": "check that every node/process started and its own log for an earlier error; the same MASTER_ADDR, "
            "MASTER_PORT, --nnodes and world size everywhere; MASTER_ADDR reachable from all nodes (nc -zv); the "
            "count joined shows how many are missing"},
    {"class": "shm_too_small",
     "category": "host_memory",
     "symptom": "no",
     "pattern": r"insufficient shared memory \(shm\)|unable to write to file </torch_\d+|DataLoader worker "
                r"\(pid\(?s?\)? ?\d+\) is killed by signal: Bus error",
     "source": "torch/csrc/DataLoader.cpp (bus error handler) and aten/src/ATen/MapAllocator.cpp ('unable to write to "
               "file </torch_...>')",
     "example": "https://github.com/pangeo-data/pangeo-docker-images/issues/258",
     "cause": "/dev/shm is too small for tensors shared between processes (DataLoader workers, "
              "torch.multiprocessing); Docker's default is 64 MB",
     "fix": "enlarge /dev/shm: docker run --shm-size=16g or --ipc=host, on Kubernetes an emptyDir with medium: Memory "
            "mounted at /dev/shm; or fewer DataLoader workers / num_workers=0"},
    {"class": "dataloader_worker_killed",
     "category": "host_memory",
     "symptom": "yes",
     "pattern": r"DataLoader worker \(pid\(?s?\)? ?\d+\) is killed by signal: Killed",
     "source": "torch/csrc/DataLoader.cpp ('DataLoader worker (pid %d) is killed by signal: %s')",
     "example": "https://github.com/hezhangsprinter/DCPDN/issues/12",
     "cause": "a DataLoader worker process got SIGKILL, almost always from the kernel OOM killer because host memory "
              "ran out (each worker holds a copy of the dataset)",
     "fix": "fewer DataLoader workers (num_workers), smaller prefetch/batches, keep the dataset memory-mapped rather "
            "than in Python lists; check dmesg for the OOM kill; more host memory"},
    {"class": "too_many_open_files",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"\[Errno 24\] Too many open files",
     "source": "the OS's EMFILE, as Python's OSError prints it",
     "example": "https://github.com/facebookresearch/maskrcnn-benchmark/issues/158",
     "cause": "the process hit its open-file limit (ulimit -n): torch.multiprocessing's file_descriptor sharing "
              "strategy, many DataLoader workers, sockets or leaked file handles",
     "fix": "raise the limit (ulimit -n 65535, LimitNOFILE / pod securityContext); "
            "torch.multiprocessing.set_sharing_strategy('file_system'); fewer DataLoader workers; close files"},
    {"class": "slurm_node_fail",
     "category": "scheduler",
     "symptom": "no",
     "pattern": r"CANCELLED AT \S+ DUE TO NODE FAIL(URE)?|(srun|salloc|sbatch): error: Node failure on \S+",
     "source": "srun/salloc ('error: Node failure on %s') and slurmstepd's cancellation message "
               "(src/slurmd/slurmstepd/req.c)",
     "example": "https://github.com/nebius/soperator/issues/854",
     "cause": "Slurm lost contact with a node of the allocation (the machine crashed, rebooted or dropped off the "
              "network) and killed the job step",
     "fix": "resubmit with resume=auto (sbatch --requeue lets Slurm do it) and exclude the bad node (--exclude); "
            "report the node to the admins; checkpoint more often (checkpoint.every)"},
    {"class": "gloo_connect",
     "category": "network",
     "symptom": "no",
     "pattern": r"Gloo connectFullMesh failed with|Unable to find address for: \S+|gloo::IoException",
     "source": "torch/csrc/distributed/c10d/ProcessGroupGloo.cpp ('Gloo connectFullMesh failed with') and "
               "gloo/transport/tcp (device.cc, pair.cc)",
     "example": "https://github.com/vllm-project/vllm/issues/7074",
     "cause": "Gloo could not connect all ranks: it bound to the wrong network interface (the hostname resolves to "
              "loopback or a NIC the other nodes cannot reach), a firewall, or an interface name that does not exist",
     "fix": "set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) to the interface that carries the node's routable IP on "
            "every node (ip addr); make the hostname resolve to that IP; open the ports between nodes"},
    {"class": "nccl_socket_interface",
     "category": "network",
     "symptom": "no",
     "pattern": "Bootstrap : no socket interface found|no NCCL_SOCKET_IFNAME interface found",
     "source": "NCCL's bootstrap (src/bootstrap.cc: WARN 'Bootstrap : no socket interface found')",
     "example": "https://github.com/EasonXiao-888/MambaTree/issues/14",
     "cause": "NCCL found no usable network interface for its bootstrap: NCCL_SOCKET_IFNAME names an interface that "
              "does not exist on this node, or only loopback/docker interfaces are up",
     "fix": "unset NCCL_SOCKET_IFNAME or set it to a real interface on every node (ip addr; a prefix like eth or "
            "^lo,docker excludes); NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET shows which interfaces NCCL sees"},
    # ---- frameworks and model files
    {"class": "vllm_kv_cache_too_small",
     "category": "gpu_memory",
     "symptom": "no",
     "pattern": "KV cache is needed, which is larger than the available KV cache memory|The model's max seq len "
                r"\(\d+\) is larger than the maximum number of tokens that can be stored in KV cache",
     "source": "vllm/v1/core/kv_cache_utils.py (_check_enough_kv_cache_memory); vllm/worker/worker.py "
               "(raise_if_cache_size_invalid) in the v0 engine",
     "example": "https://github.com/vllm-project/vllm/issues/34076",
     "cause": "vLLM refused to start: after the weights and activations, the GPU memory left for the KV cache cannot "
              "hold even one sequence of max_model_len tokens",
     "fix": "raise rollout.gpu_memory_utilization (if the trainer leaves room), cap the model length (vLLM "
            "max_model_len, i.e. prompt length + rollout.max_new_tokens) to the estimated maximum it prints, shard "
            "the rollout engine wider (parallel.tp) or use a quantized/smaller model"},
    {"class": "vllm_no_cache_memory",
     "category": "gpu_memory",
     "symptom": "no",
     "pattern": "No available memory for the cache blocks",
     "source": "vllm/v1/core/kv_cache_utils.py (_check_enough_kv_cache_memory); vllm/worker/worker.py "
               "(raise_if_cache_size_invalid) in the v0 engine",
     "example": "https://github.com/vllm-project/vllm/issues/36861",
     "cause": "vLLM's memory profile left zero (or negative) bytes for the KV cache: the gpu_memory_utilization share "
              "is smaller than weights + activations + CUDA graphs, or another process (the trainer, a second engine) "
              "already holds the GPU's memory",
     "fix": "raise rollout.gpu_memory_utilization (e.g. 0.5 -> 0.7) or free the GPU first (offload the trainer: "
            "parallel.offload=all; do not colocate two engines); lower rollout.workers per GPU; enforce_eager=True "
            "saves the CUDA-graph memory"},
    {"class": "vllm_max_model_len",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"User-specified max_model_len \(\d+\) is greater than the derived max_model_len",
     "source": "vllm/config/model.py (ModelConfig, _get_and_verify_max_len; vllm/config.py in older versions)",
     "example": "https://github.com/vllm-project/vllm/pull/19660",
     "cause": "the requested max_model_len (prompt + response length) is longer than the model's "
              "max_position_embeddings in config.json",
     "fix": "shorten the prompt length or rollout.max_new_tokens so the total fits the model's context; for a model "
            "with RoPE scaling set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 only if its config really supports the length"},
    {"class": "vllm_engine_dead",
     "category": "software",
     "symptom": "yes",
     "pattern": r"EngineDeadError|EngineCore encountered an issue|Engine core proc \S+ died unexpectedly",
     "source": "vllm/v1/engine/exceptions.py (EngineDeadError), vllm/v1/engine/core_client.py",
     "example": "https://github.com/vllm-project/vllm/issues/42362",
     "cause": "the vLLM EngineCore process died earlier (GPU out of memory, a CUDA error, a kernel bug, killed by the "
              "OS) and every later request fails with this error",
     "fix": "scroll up to the first EngineCore traceback (lines prefixed '(EngineCore_DP0 pid=...)') or dmesg for the "
            "real error and fix that; for memory lower rollout.gpu_memory_utilization or max_num_seqs"},
    {"class": "vllm_tp_heads_divisibility",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"Total number of attention heads \(\d+\) must be divisible by tensor parallel size \(\d+\)",
     "source": "vllm/config (ModelConfig.verify_with_parallel_config)",
     "example": "https://github.com/vllm-project/vllm/issues/414",
     "cause": "the rollout tensor-parallel size does not divide the model's number of attention heads",
     "fix": "set parallel.tp (the rollout engine's tensor_parallel_size) to a divisor of the head count (1, 2, 4, 8 "
            "for most models), not e.g. 3 or 6"},
    {"class": "vllm_arch_not_supported",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"Model architectures \[.*\] (are|is) not supported for now",
     "source": "vllm/model_executor/models/registry.py (ModelRegistry._raise_for_unsupported)",
     "example": "https://github.com/vllm-project/vllm/issues/9515",
     "cause": "the installed vLLM does not know the model's architecture (vLLM too old for the model) or the model "
              "registry failed to import (a broken install: the real error is logged above by registry.py)",
     "fix": "upgrade vLLM to a release that supports the architecture, or check the first 'Error in inspecting model "
            "architecture' traceback for an import failure; model.path must point to a supported model"},
    {"class": "sglang_mem_fraction",
     "category": "gpu_memory",
     "symptom": "no",
     "pattern": r"Not enough memory\. Please try to increase --mem-fraction-static|Not enough memory to allocate KV "
                "cache",
     "source": "sglang python/sglang/srt/model_executor/model_runner.py (init_memory_pool; pool_configurator.py in "
               "newer versions)",
     "example": "https://github.com/sgl-project/sglang/issues/4330",
     "cause": "SGLang's static memory share (--mem-fraction-static) leaves no room for the KV-cache pool after the "
              "weights are loaded",
     "fix": "raise --mem-fraction-static (rollout.gpu_memory_utilization) if the GPU is otherwise free, shard the "
            "model wider (parallel.tp), or free memory held by the trainer (parallel.offload) before the engine starts"},
    {"class": "deepspeed_op_build",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"CUDA_HOME does not exist, unable to compile CUDA op\(s\)|Unable to JIT load the \w+ op|Error "
                r"building extension '\w+'",
     "source": "deepspeed/ops/op_builder/builder.py (installed_cuda_version, OpBuilder.jit_load); "
               "torch/utils/cpp_extension.py (Error building extension)",
     "example": "https://github.com/jingyaogong/minimind/issues/48",
     "cause": "DeepSpeed had to JIT-compile a CUDA op (fused_adam, cpu_adam, ...) but no CUDA toolkit (nvcc) is "
              "found, or ninja/the compiler failed (toolkit version differs from torch's CUDA)",
     "fix": "install a CUDA toolkit matching torch.version.cuda and set CUDA_HOME=/usr/local/cuda-XX.Y, or install "
            "DeepSpeed with prebuilt ops (DS_BUILD_OPS=1 pip install deepspeed); check `ds_report`"},
    {"class": "deepspeed_checkpoint_missing",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"Unable to find latest file at \S+, if trying to load latest checkpoint",
     "source": "deepspeed/runtime/engine.py (DeepSpeedEngine.load_checkpoint)",
     "example": "https://github.com/lean-dojo/ReProver/issues/71",
     "cause": "resume pointed DeepSpeed at a directory with no 'latest' tag file: not a DeepSpeed checkpoint, a "
              "checkpoint that was never completed (job killed while saving) or a wrong path",
     "fix": "point the resume at a directory holding 'latest' and global_stepN/ (or pass the tag explicitly); with "
            "unirl use resume=auto so only complete checkpoints are picked; check run.dir and checkpoint.keep"},
    {"class": "deepspeed_batch_mismatch",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"train_batch_size is not equal to micro_batch_per_gpu \* gradient_acc_step \* world_size",
     "source": "deepspeed/runtime/config.py (DeepSpeedConfig._batch_assertion)",
     "example": "https://github.com/OpenRLHF/OpenRLHF/issues/346",
     "cause": "the global batch size is not micro_batch_per_gpu x gradient accumulation x the number of data-parallel "
              "ranks, usually because the GPU count changed (e.g. 7 GPUs instead of 8)",
     "fix": "make the global batch a multiple of trainer.micro_batch_size x parallel.dp (the number of GPUs), or let "
            "the launcher derive gradient accumulation; recheck after changing the GPU count"},
    {"class": "megatron_parallel_divisibility",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"world_size \(\d+\) is not divisible by",
     "source": "megatron/core/parallel_state.py (initialize_model_parallel, RankGenerator)",
     "example": "https://github.com/THUDM/slime/issues/1818",
     "cause": "the number of processes is not a multiple of tensor x pipeline x context (x expert) model-parallel "
              "sizes, so Megatron cannot form data-parallel groups",
     "fix": "choose parallel.tp x parallel.pp (x context/expert parallel) that divides the total GPU count (nodes x "
            "GPUs per node), or launch more GPUs"},
    {"class": "verl_batch_divisibility",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"real_train_batch_size \(\d+\) must be divisible by minimal possible batch size|only support equal "
                r"chunk\. Got size of DataProto \d+ and chunk \d+|ppo_mini_batch_size \(?\d+\)? should be larger than "
                r"0 after normalization|train_batch_size \(\d+\) must be >= (actor|critic)\.ppo_mini_batch_size",
     "source": "verl/utils/config.py (validate_config), verl/protocol.py (DataProto.chunk), "
               "verl/workers/config/actor.py",
     "example": "https://github.com/verl-project/verl/issues/473",
     "cause": "verl's batch sizes do not split evenly over the workers: data.train_batch_size x rollout.n is not a "
              "multiple of the GPU count (or of dp x micro batch for Megatron), or ppo_mini_batch_size becomes 0 per "
              "GPU",
     "fix": "make data.train_batch_size (x rollout.n) a multiple of nnodes x n_gpus_per_node and ppo_mini_batch_size "
            "x rollout.n >= the GPU count; in unirl keep the batch a multiple of parallel.dp"},
    {"class": "trl_generation_batch_divisibility",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"must be evenly divisible by the number of generations per prompt|generation_batch_size \(\d+\) must "
                r"be divisible by num_generations \(\d+\)",
     "source": "trl/trainer/grpo_config.py (GRPOConfig.__post_init__); trl/trainer/grpo_trainer.py in older versions",
     "example": "https://github.com/huggingface/open-r1/issues/249",
     "cause": "GRPO's generation batch (processes x per_device_train_batch_size x steps_per_generation) cannot be "
              "split into whole groups of num_generations completions per prompt",
     "fix": "pick num_generations that divides processes x per_device_train_batch_size x gradient accumulation (the "
            "error lists valid values), or raise per_device_train_batch_size / gradient_accumulation_steps"},
    {"class": "hf_model_not_found",
     "category": "configuration",
     "symptom": "no",
     "pattern": "is not a local folder and is not a valid model identifier|does not appear to have a file named "
                r"(pytorch_model\.bin|model\.safetensors|config\.json)|Error no file named (pytorch_model\.bin|"
                r"model\.safetensors)",
     "source": "transformers/utils/hub.py (cached_file) and transformers/modeling_utils.py (from_pretrained)",
     "example": "https://github.com/EleutherAI/lm-evaluation-harness/issues/995",
     "cause": "the model path is neither an existing local directory nor a Hub repo id (typo, relative path from "
              "another working directory), or the directory lacks the weight files (incomplete download or checkpoint "
              "saved without weights)",
     "fix": "set model.path to an absolute local directory containing config.json and *.safetensors, or to a valid "
            "'org/name' repo id; for a private repo log in (HF_TOKEN)"},
    {"class": "hf_offline_missing",
     "category": "network",
     "symptom": "no",
     "pattern": r"LocalEntryNotFoundError|We couldn't connect to '?https://huggingface\.co'? to load|outgoing traffic "
                "has been disabled",
     "source": "huggingface_hub/file_download.py (LocalEntryNotFoundError); transformers/utils/hub.py (cached_file)",
     "example": "https://github.com/yuruotong1/autoMate/issues/104",
     "cause": "the files are not in the local Hugging Face cache and the Hub could not be reached (no internet on the "
              "compute node, a proxy, or HF_HUB_OFFLINE=1 / local_files_only)",
     "fix": "download the model on a machine with access (huggingface-cli download org/name --local-dir DIR) and set "
            "model.path to that directory, or point HF_HOME at the shared cache; set HF_ENDPOINT for a mirror"},
    {"class": "hf_gated_repo",
     "category": "configuration",
     "symptom": "no",
     "pattern": "GatedRepoError|Cannot access gated repo for url|You are trying to access a gated repo",
     "source": "huggingface_hub/utils/_http.py (hf_raise_for_status: GatedRepoError); transformers/utils/hub.py",
     "example": "https://github.com/ToTheBeginning/PuLID/issues/97",
     "cause": "the model is gated on the Hub and the request carried no token, or the token's account has not been "
              "granted access",
     "fix": "accept the model's licence on its Hub page, then export HF_TOKEN=hf_... (or huggingface-cli login) on "
            "every node, or pre-download the weights and set model.path to the local directory"},
    {"class": "safetensors_corrupt",
     "category": "disk",
     "symptom": "no",
     "pattern": "SafetensorError: Error while deserializing header|incomplete metadata, file not fully covered",
     "source": "safetensors (Rust) safetensors/src/tensor.rs, raised through safetensors_rust.SafetensorError",
     "example": "https://github.com/nicolaus-huang/ProcessPainter/issues/5",
     "cause": "a .safetensors file is truncated or not a safetensors file at all: an interrupted download, a git-lfs "
              "pointer instead of the weights, or a checkpoint written while the disk filled",
     "fix": "compare file sizes/hashes with the source and re-download the shard (huggingface-cli download "
            "--force-download); install git-lfs before cloning; re-save the checkpoint"},
    {"class": "tokenizer_no_pad_token",
     "category": "configuration",
     "symptom": "no",
     "pattern": "Asking to pad but the tokenizer does not have a padding token",
     "source": "transformers/tokenization_utils_base.py (_get_padding_truncation_strategies)",
     "example": "https://github.com/huggingface/trl/issues/466",
     "cause": "the tokenizer (GPT-2, Llama and other base models) defines no pad token and batching asked it to pad",
     "fix": "set tokenizer.pad_token = tokenizer.eos_token (or add a [PAD] token and resize the embeddings) before "
            "training or generation"},
    {"class": "unrecognized_architecture",
     "category": "configuration",
     "symptom": "no",
     "pattern": "but Transformers does not recognize this architecture",
     "source": "transformers/models/auto/configuration_auto.py (AutoConfig.from_pretrained)",
     "example": "https://github.com/city96/ComfyUI_ExtraModels/issues/114",
     "cause": "config.json names a model_type the installed transformers does not know: transformers is older than "
              "the model, or the model needs its own code (trust_remote_code)",
     "fix": "pip install -U transformers (or the version the model card names); for custom models pass "
            "trust_remote_code=True; check model.path points at the right checkpoint"},
    {"class": "trust_remote_code",
     "category": "configuration",
     "symptom": "no",
     "pattern": "requires you to execute the configuration file in that repo|requires you to execute custom code "
                "contained in the model repository|contains custom code which must be executed to correctly load the "
                "model",
     "source": "transformers/dynamic_module_utils.py (resolve_trust_remote_code)",
     "example": "https://github.com/h2oai/h2o-llmstudio/issues/560",
     "cause": "the model ships its own modelling code (auto_map in config.json) and loading was not allowed to run it",
     "fix": "after reviewing the repo's code, pass trust_remote_code=True to the model, tokenizer and rollout engine "
            "(vLLM --trust-remote-code), or use a transformers version with native support for the model"},
    {"class": "flash_attn_not_installed",
     "category": "configuration",
     "symptom": "no",
     "pattern": r"FlashAttention\d? has been toggled on, but it cannot be used due to the following error: the package "
                r"(flash_attn seems to be not installed|for FlashAttention\d? doesn't seem to be installed)",
     "source": "transformers/modeling_utils.py (_check_and_enable_flash_attn_2 / _flash_attn_can_dispatch)",
     "example": "https://github.com/hiyouga/EasyR1/issues/384",
     "cause": "the model was loaded with attn_implementation='flash_attention_2' but the flash-attn package is not "
              "installed in this environment",
     "fix": "pip install flash-attn --no-build-isolation (matching torch and CUDA), or load the model with "
            "attn_implementation='sdpa'"},
]

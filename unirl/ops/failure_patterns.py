"""What ``unirl diagnose`` recognises: one entry per failure class, data only.

Each pattern is a regular expression matched against each line of a log; the text it matches is the
message as the tool that writes it prints it (``source`` names where), and each is tested on such text
(tests/data/logs). ``cause`` and ``fix`` are what the answer says.
"""

from __future__ import annotations

PATTERNS: list[dict[str, str]] = [
    {"class": "nccl_timeout",
     "pattern": r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=\d+, OpType=\w+",
     "source": "torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (the watchdog's timeout message)",
     "cause": "a collective did not finish within the process group's timeout: one rank is stuck or much slower "
              "(a hang in data loading or the rollout, a dead peer, a mismatched collective), or the network stalled",
     "fix": "find the rank that did not reach the collective (NCCL_DEBUG=INFO, TORCH_DISTRIBUTED_DEBUG=DETAIL, py-spy "
            "dump on each rank); raise the timeout only once a slow rank is the cause"},
    {"class": "nccl_error",
     "pattern": r"NCCL error in: .*ProcessGroupNCCL\.cpp|nccl(Internal|UnhandledCuda|System|Remote|InvalidUsage)Error",
     "source": "torch/csrc/distributed/c10d/NCCLUtils.hpp (C10D_NCCL_CHECK) and NCCL's ncclResult_t names",
     "cause": "NCCL failed: a network or InfiniBand problem, a peer that died, mismatched NCCL versions, or a CUDA "
              "error inside a collective",
     "fix": "rerun with NCCL_DEBUG=INFO to see the failing transport; check every node runs the same torch/NCCL build "
            "and that NCCL_SOCKET_IFNAME / NCCL_IB_HCA name the right interfaces"},
    {"class": "cuda_oom",
     "pattern": r"(torch\.OutOfMemoryError|torch\.cuda\.OutOfMemoryError|RuntimeError): CUDA out of memory\. "
                r"Tried to allocate",
     "source": "c10/cuda/CUDACachingAllocator.cpp (the allocator's out-of-memory message)",
     "cause": "a GPU ran out of memory: the micro-batch, sequence length, model or rollout engine's share is too large",
     "fix": "lower trainer.micro_batch_size or set trainer.max_tokens_per_micro_batch, shorten rollout.max_new_tokens, "
            "give vLLM a smaller share (rollout.gpu_memory_utilization), shard more (parallel.zero_stage=3, tp); "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True when reserved-but-unallocated memory is large"},
    {"class": "cuda_illegal_memory_access",
     "pattern": r"CUDA error: an illegal memory access was encountered",
     "source": "the CUDA runtime's cudaErrorIllegalAddress, as torch's C10_CUDA_CHECK prints it",
     "cause": "a kernel read or wrote out of bounds (an index past a tensor's end, a kernel bug, bad hardware); the "
              "error surfaces at a later call, not where it happened",
     "fix": "rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; check token ids against the vocabulary size; "
            "compute-sanitizer on a small reproduction"},
    {"class": "ray_actor_died",
     "pattern": r"ActorDiedError|The actor died unexpectedly before finishing this task",
     "source": "ray/exceptions.py: ActorDiedError.BASE_ERROR_MSG",
     "cause": "a Ray actor (a rollout or reward worker) died: killed for memory by Ray's memory monitor or the OS, "
              "or it crashed",
     "fix": "read the actor's own log (ray logs / /tmp/ray/session_latest/logs, worker-*.err) for its last error; "
            "for memory, fewer workers per node or more memory per worker"},
    {"class": "ray_object_store_full",
     "pattern": r"ObjectStoreFullError|The local object store is full of objects|Spilled \d+ MiB, \d+ objects",
     "source": "ray/exceptions.py: ObjectStoreFullError; ray/_private/internal_api.py (spill statistics)",
     "cause": "Ray's object store is full: objects kept in scope (batches, weights) pile up and spill to disk",
     "fix": "drop references to old batches; fewer in-flight batches (rollout.max_staleness); a larger object store "
            "(ray start --object-store-memory)"},
    {"class": "no_space_left",
     "pattern": r"\[Errno 28\] No space left on device",
     "source": "the OS's ENOSPC, as Python's OSError prints it",
     "cause": "a disk is full: checkpoints, exports or caches in the run directory or /tmp",
     "fix": "free space or point run.dir at a larger disk; checkpoint.keep bounds the checkpoints kept"},
    {"class": "stale_file_handle",
     "pattern": r"\[Errno 116\] Stale file handle",
     "source": "the OS's ESTALE, as Python's OSError prints it",
     "cause": "a network file system (NFS) file was replaced or removed on another node while this one held it",
     "fix": "keep run directories and caches on a local disk or one writer per file; retry the read"},
    {"class": "nan_loss",
     "pattern": r"gradient norm is (nan|inf|-inf)|loss (is|=) nan|non-finite (loss|gradient)",
     "source": "unirl's own step (unirl/engine/reference_trainer.py, unirl/engine/deepspeed.py: FloatingPointError)",
     "cause": "a loss or gradient became NaN or infinite: a learning rate too high, a reward or advantage blow-up, "
              "16-bit overflow",
     "fix": "lower trainer.lr, set trainer.grad_clip, check the rewards' range (reward_range), train in float32 or "
            "bfloat16 rather than float16"},
    {"class": "slurm_preempted",
     "pattern": r"\*\*\* (JOB|STEP) [\d.]+ ON \S+ CANCELLED AT \S+ DUE TO PREEMPTION \*\*\*",
     "source": "slurmstepd's cancellation message (src/slurmd/slurmstepd/req.c)",
     "cause": "Slurm preempted the job for a higher-priority one",
     "fix": "resubmit with resume=auto (the newest checkpoint is kept); sbatch --requeue makes Slurm do it"},
    {"class": "slurm_time_limit",
     "pattern": r"\*\*\* (JOB|STEP) [\d.]+ ON \S+ CANCELLED AT \S+ DUE TO TIME LIMIT \*\*\*",
     "source": "slurmstepd's cancellation message (src/slurmd/slurmstepd/req.c)",
     "cause": "the job reached its time limit",
     "fix": "resubmit with resume=auto and a longer --time, or checkpoint more often (checkpoint.every)"},
    {"class": "oom_killed",
     "pattern": r"Detected \d+ oom[-_]kill event|Out of memory: Killed process \d+|oom-kill:constraint=",
     "source": "slurmstepd (task/cgroup) and the Linux kernel's OOM killer (dmesg)",
     "cause": "the host ran out of CPU memory and the kernel killed a process",
     "fix": "fewer processes per node (reward workers, rollout workers), smaller batches, parallel.offload=none, or "
            "more memory per job (--mem)"},
    {"class": "connection_refused",
     "pattern": r"ConnectionRefusedError|\[Errno 111\] Connection refused|Connection refused",
     "source": "the OS's ECONNREFUSED, as Python and gRPC print it",
     "cause": "nothing listens at the address: the server (reward service, vLLM server, Ray head, rendezvous) is not "
              "up yet or died",
     "fix": "check the address and port, that the server started, and firewalls between the nodes"},
    {"class": "connection_timed_out",
     "pattern": r"\[Errno 110\] Connection timed out|TimeoutError: timed out|The client socket has timed out",
     "source": "the OS's ETIMEDOUT as Python prints it; torch's TCPStore (torch/csrc/distributed/c10d/TCPStore.cpp)",
     "cause": "a peer did not answer in time: a wrong address, a firewall, or the other side is overloaded",
     "fix": "check MASTER_ADDR / the rendezvous endpoint is reachable from every node (nc -zv host port)"},
    {"class": "rank_mismatch",
     "pattern": r"Detected mismatch between collectives on ranks",
     "source": "torch/csrc/distributed/c10d/ProcessGroupWrapper.cpp (TORCH_DISTRIBUTED_DEBUG=DETAIL)",
     "cause": "ranks called different collectives (or shapes) in the same position: ranks took different code paths",
     "fix": "make every rank run the same steps (equal batch shares: parallel.dp divides the batch; the same "
            "micro-batch counts)"},
]

"""The simplest correct run of a recipe as a process of its own: torch and transformers only.

``unirl bench RECIPE --baseline plain`` writes a job file from the recipe (:func:`unirl.bench.plain.write_job`:
the model's path, the optimizer and sampling settings, and every step's examples, drawn from the task
seeded as a run draws them) and runs this file by its path::

    python unirl/bench/plain_process.py JOB.json OUT.json [WEIGHTS.safetensors]

so that nothing of unirl is imported: the folder of this file is first on ``sys.path`` and
:class:`simple_loop.SimpleLoop` (torch only) is imported from it as a top-level module. What a user
would write beside ``unirl run``: load the model, run every stage's steps with the loop, save the
weights. ``OUT.json`` gets the loop's wall seconds (the first step's start to the last step's end),
the process's seconds before the loop (imports and loading), each part's seconds, and the modules
of the ``unirl`` package loaded (none: a test asserts it); ``WEIGHTS`` the model's weights after it.
"""

import copy
import json
import os
import re
import sys
import time

T0 = time.perf_counter()

import torch  # noqa: E402
from simple_loop import SimpleLoop  # noqa: E402  (this folder, not the unirl package)
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

INTEGER = re.compile(r"\s*(-?\d+)\s*")


def arithmetic_reward(correct, well_formed):
    """The arithmetic task's rule: ``correct`` for the exact integer answer, ``well_formed`` for another integer."""
    def reward(completions, answers):
        out = []
        for completion, answer in zip(completions, answers):
            m = INTEGER.fullmatch(completion)
            out.append(0.0 if m is None else correct if m.group(1) == answer.strip() else well_formed)
        return out
    return reward


def deepspeed_loop():
    """DeepSpeed alone (``framework: deepspeed``): the loop's model is a DeepSpeed engine, as a DeepSpeed user
    writes it: ``deepspeed.initialize`` on the model with the recipe's AdamW and clipping, forward through the
    engine, ``engine.backward`` on each micro-batch's share of the loss, ``engine.step`` at the step's end."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    # DeepSpeed's CPU accelerator JIT-builds a small op once: the environment's cache, as a run's ranks use
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")

    class DeepSpeedLoop(SimpleLoop):
        def __init__(self, model, tok, **settings):
            super().__init__(model, tok, **settings)
            dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(model.dtype)
            config = {"train_micro_batch_size_per_gpu": settings["micro_batch"], "gradient_accumulation_steps": 1,
                      "gradient_clipping": settings["grad_clip"] if settings["grad_clip"] != float("inf") else 0.0,
                      "optimizer": {"type": "AdamW", "params": {"lr": settings["lr"], "betas": settings["betas"],
                                                                "eps": settings["eps"], "torch_adam": True,
                                                                "weight_decay": settings["weight_decay"]}},
                      "zero_optimization": {"stage": 0}, "bf16": {"enabled": dtype == "bf16"},
                      "fp16": {"enabled": dtype == "fp16"}, "steps_per_print": 10**9}
            self.model, self.opt, _, _ = deepspeed.initialize(model=model, config=config,
                                                              model_parameters=list(model.parameters()))

        def backward(self, loss):  # the shares already sum to the step's loss: no division by DeepSpeed
            self.model.set_gradient_accumulation_boundary(False)
            self.model.backward(loss, scale_wrt_gas=False)

        def optimizer_step(self):  # DeepSpeed clips (gradient_clipping), steps AdamW and zeroes the gradients
            self.model.set_gradient_accumulation_boundary(True)
            self.model.step()

    return DeepSpeedLoop


#: framework -> the loop class made with it (imported only when the job names it)
FRAMEWORK_LOOPS = {"deepspeed": deepspeed_loop}


def main(job_path, out_path):
    job = json.loads(open(job_path).read())
    if job["threads"]:
        torch.set_num_threads(job["threads"])
    torch.manual_seed(job["seed"])
    tok = AutoTokenizer.from_pretrained(job["model"])
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=getattr(torch, job["dtype"]),
                                                 attn_implementation="sdpa")
    framework = job.get("framework", "plain")
    loop = (SimpleLoop if framework == "plain" else FRAMEWORK_LOOPS[framework]())(model, tok, **job["loop"])
    reward = arithmetic_reward(**job["reward"])
    parts = {"sft": 0.0, "generate": 0.0, "reward": 0.0, "update": 0.0}  # seconds, summed over the steps
    loaded = time.perf_counter()
    for stage in job["stages"]:
        loop.set_lr(stage["lr"])
        if stage["type"] == "rl":  # the policy the stage starts from
            loop.reference = copy.deepcopy(model).eval().requires_grad_(False)
        group = job["loop"]["group"]
        for batch in stage["batches"]:
            prompts = [e[0] for e in batch]
            t0 = time.perf_counter()
            if stage["type"] == "sft":
                loop.sft_step(prompts, [e[1] for e in batch])
                parts["sft"] += time.perf_counter() - t0
                continue
            # SimpleLoop.rl_step, its parts timed
            seq, attn, mask, texts = loop.generate(prompts)
            t1 = time.perf_counter()
            scores = torch.tensor(reward(texts, [e[2] for e in batch for _ in range(group)]), dtype=torch.float32)
            t2 = time.perf_counter()
            loop.update(seq, attn, mask, scores)
            t3 = time.perf_counter()
            parts["generate"] += t1 - t0
            parts["reward"] += t2 - t1
            parts["update"] += t3 - t2
    done = time.perf_counter()
    if len(sys.argv) > 3:  # the weights after the loop, for the bench's check that both computed the same
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"
                   or not model.config.tie_word_embeddings}, sys.argv[3])
    unirl_modules = sorted(m for m in sys.modules if m == "unirl" or m.startswith("unirl."))
    with open(out_path, "w") as f:
        json.dump({"loop_s": done - loaded, "start_s": loaded - T0, "parts_s": parts, "unirl_modules": unirl_modules,
                   "threads": torch.get_num_threads()}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

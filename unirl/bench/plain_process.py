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

With ``alone`` in the job (:func:`loop_class`) the loop is a framework alone, made by a module of the
backend's distribution (``unirl_backends.NAME.alone``, which imports nothing of unirl): DeepSpeed, verl,
OpenRLHF or Megatron-core driving the same steps with its own engine, optimizer and losses.
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


def one_rank():
    """The variables torch.distributed reads for a process group of this process alone."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])


class PlainLoop(SimpleLoop):
    """The plain loop with the two moments a framework's loop may need: the rl stage's start (the reference
    frozen: here a copy of the model) and before generating (the trained weights into the model that generates:
    nothing here, one model trains and generates)."""

    def __init__(self, model, tokenizer, **settings):
        super().__init__(model, tokenizer, **settings)
        self.module = model  # the Hugging Face model (a framework's loop may wrap self.model)

    def freeze_reference(self):
        self.reference = copy.deepcopy(self.module).eval().requires_grad_(False)

    def sync_weights(self):
        pass


def loop_class(job):
    """The loop of the job: the plain loop, or a backend's framework alone (``job["alone"]``: the module of the
    backend distribution that makes it, :class:`unirl.protocols.AloneLoops`, and its settings)."""
    alone = job.get("alone")
    if alone is None:
        return PlainLoop
    import importlib

    one_rank()
    return importlib.import_module(alone["module"]).make(PlainLoop, path=job["model"], seed=job["seed"],
                                                         **alone["settings"])


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
    loop = loop_class(job)(model, tok, **job["loop"])
    reward = arithmetic_reward(**job["reward"])
    parts = {"sft": 0.0, "generate": 0.0, "reward": 0.0, "update": 0.0, "sync": 0.0}  # seconds, summed over the steps
    loaded = time.perf_counter()
    for stage in job["stages"]:
        loop.set_lr(stage["lr"])
        if stage["type"] == "rl":  # the policy the stage starts from
            loop.freeze_reference()
        group = job["loop"]["group"]
        for batch in stage["batches"]:
            prompts = [e[0] for e in batch]
            t0 = time.perf_counter()
            if stage["type"] == "sft":
                loop.sft_step(prompts, [e[1] for e in batch])
                parts["sft"] += time.perf_counter() - t0
                continue
            loop.sync_weights()  # the trained weights into the model that generates
            parts["sync"] += time.perf_counter() - t0
            t0 = time.perf_counter()
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
        loop.sync_weights()
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"
                   or not model.config.tie_word_embeddings}, sys.argv[3])
    unirl_modules = sorted(m for m in sys.modules if m == "unirl" or m.startswith("unirl."))
    with open(out_path, "w") as f:
        json.dump({"loop_s": done - loaded, "start_s": loaded - T0, "parts_s": parts, "unirl_modules": unirl_modules,
                   "threads": torch.get_num_threads()}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

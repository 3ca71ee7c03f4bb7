"""An rl stage of a unirl recipe as AReaL's own GRPO run (``backend_options.mode=trainer``), under
AReaL's environment's Python; it imports AReaL, never unirl.

``python -m unirl_backends.areal.trainer_script --config STAGE.yaml [KEY=VALUE ...]``: the config is
AReaL's ``GRPOConfig`` (written by :mod:`unirl_backends.areal.trainer_mode`), read with AReaL's own loader
(``areal.api.cli_args.load_expr_config``, Hydra overrides after it); ``--check`` loads it, reads the data and
stops (what the dry run runs here, on any machine). Otherwise AReaL's ``PPOTrainer`` trains with its
``RLVRWorkflow`` (an SGLang or vLLM server on CUDA, as AReaL's own examples), as its GSM8K example does.

- **Data**: the stage's prompts as JSON lines (``prompt`` already rendered by unirl's task, ``answer``
  and the task's fields); :func:`prompt_ids` tokenises the prompt as it is (no chat template again).
- **Reward**: unirl's reward function stays in unirl's process. :func:`reward_fn` (AReaL's reward
  signature) asks it over a local socket (``UNIRL_AREAL_REWARD``: address and auth key), JSON both ways.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def prompt_ids(data: dict[str, Any], tokenizer: Any, enable_thinking: bool = False) -> list[int]:
    """``RLVRWorkflow``'s ``get_input_ids_fn``: the rendered prompt's tokens, no template applied again."""
    return list(tokenizer(data["prompt"], add_special_tokens=False)["input_ids"])


def prompt_text(data: dict[str, Any]) -> str:
    """``RLVRWorkflow``'s ``data_extract_prompt_fn``."""
    return data["prompt"]


_CONNECTION: Any = None


def _connection() -> Any:
    global _CONNECTION
    if _CONNECTION is None:
        from multiprocessing.connection import Client

        address, key = os.environ["UNIRL_AREAL_REWARD"].split("#", 1)
        _CONNECTION = Client(address, family="AF_UNIX", authkey=bytes.fromhex(key))
    return _CONNECTION


def reward_fn(prompt: str, completions: str, prompt_ids: list[int], completion_ids: list[int], **data: Any) -> float:
    """AReaL's reward signature (``areal/reward/gsm8k.py``); unirl's reward scores it in unirl's process."""
    fields = {k: v for k, v in data.items() if isinstance(v, (str, int, float, bool, type(None)))}
    conn = _connection()
    conn.send_bytes(json.dumps({"prompt": prompt, "completion": completions, "fields": fields}).encode())
    return float(json.loads(conn.recv_bytes())["score"])


def read_rows(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    argv = [a for a in argv if a != "--check"]
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    from areal.api.cli_args import GRPOConfig, load_expr_config

    config, _ = load_expr_config(argv, GRPOConfig)
    rows = read_rows(config.train_dataset.path)
    if check:
        a = config.actor
        print(json.dumps({"config": "GRPOConfig", "rows": len(rows), "actor.backend": config.actor.backend, "rollout.backend": config.rollout.backend,
                          "total_train_steps": config.total_train_steps, "batch_size": config.train_dataset.batch_size,
                          "n_samples": config.gconfig.n_samples, "eps_clip": a.eps_clip, "eps_clip_higher": a.eps_clip_higher,
                          "c_clip": a.c_clip, "kl_ctl": a.kl_ctl, "reward_norm": {
                              "mean_level": a.reward_norm.mean_level, "std_level": a.reward_norm.std_level,
                              "group_size": a.reward_norm.group_size, "eps": a.reward_norm.eps},
                          "lr": a.optimizer.lr, "gradient_clipping": a.optimizer.gradient_clipping}))
        return 0
    from datasets import Dataset

    from areal.trainer import PPOTrainer

    with PPOTrainer(config, train_dataset=Dataset.from_list(rows)) as trainer:
        trainer.train(workflow="areal.workflow.rlvr.RLVRWorkflow",
                      workflow_kwargs={"reward_fn": "unirl_backends.areal.trainer_script:reward_fn",
                                       "gconfig": config.gconfig, "tokenizer": config.tokenizer_path,
                                       "enable_thinking": False,
                                       "get_input_ids_fn": "unirl_backends.areal.trainer_script:prompt_ids",
                                       "data_extract_prompt_fn": "unirl_backends.areal.trainer_script:prompt_text"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

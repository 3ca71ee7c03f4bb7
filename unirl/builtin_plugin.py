"""Built-in tasks, rewards, the HF-generate rollout and the memory buffer: the parts every
engine-mode backend composes, registered through the entry point ``builtin`` like any plugin."""

from __future__ import annotations

from unirl import hookimpl
from unirl.buffers.options import MemoryBufferConfig, PrioritizedBufferConfig
from unirl.environments.calculator import CalculatorConfig
from unirl.environments.openenv import OpenEnvConfig
from unirl.loggers.mlflow_logger import MlflowLoggerConfig
from unirl.loggers.tensorboard_logger import TensorBoardLoggerConfig
from unirl.loggers.wandb_logger import WandbLoggerConfig
from unirl.rewards import FunctionRewardConfig
from unirl.rewards.arithmetic import ArithmeticRewardConfig
from unirl.rewards.combined import CombinedRewardConfig
from unirl.rewards.format import FormatRewardConfig
from unirl.rewards.judge import JudgeRewardConfig
from unirl.rewards.math_answer import MathVerifyRewardConfig
from unirl.rewards.reward_model import RewardModelConfig
from unirl.rollouts.options import HFGenerateConfig, SGLangConfig, VLLMConfig
from unirl.tasks.arithmetic import ArithmeticTaskConfig
from unirl.tasks.dataset import DatasetTaskConfig
from unirl.tasks.text_file import TextFileTaskConfig


@hookimpl
def unirl_register_tasks(register):
    register("arithmetic", "unirl.tasks.arithmetic:ArithmeticTask", config_class=ArithmeticTaskConfig,
             description="small-number arithmetic prompts (a+b=) with integer answers")
    register("text_file", "unirl.tasks.text_file:TextFileTask", config_class=TextFileTaskConfig,
             description="raw text documents, one per line of a local file (continued pretraining)")
    register("dataset", "unirl.tasks.dataset:DatasetTask", config_class=DatasetTaskConfig,
             description="rows of a jsonl/json/parquet/csv file, folder, saved HF dataset or hub id, in verl's, "
                         "OpenRLHF's or TRL's layout (chat templates applied)")


@hookimpl
def unirl_register_rewards(register):
    register("arithmetic", "unirl.rewards.arithmetic:ArithmeticReward", config_class=ArithmeticRewardConfig,
             description="rule-based reward in [0, 1]: exact integer answer")
    register("math_verify", "unirl.rewards.math_answer:MathVerifyReward", config_class=MathVerifyRewardConfig,
             description="math answer equal to the reference (Hugging Face math-verify: boxed, LaTeX, equivalent forms)")
    register("format", "unirl.rewards.format:FormatReward", config_class=FormatRewardConfig,
             description="score for a completion matching a regular expression (default: <think>/<answer> tags)")
    register("reward_model", "unirl.rewards.reward_model:RewardModelReward", config_class=RewardModelConfig,
             description="a trained reward model's score (the folder an rm stage exports, <run.dir>/reward_model)")
    register("llm_judge", "unirl.rewards.judge:JudgeReward", config_class=JudgeRewardConfig,
             description="RLAIF: a generative model prompted with a rubric, the number in its answer / max_score")
    register("combined", "unirl.rewards.combined:CombinedReward", config_class=CombinedRewardConfig,
             description="weighted sum of rewards, each with its own options (reward.terms)")
    register("episode_return", "unirl.rewards.episode:EpisodeReturnReward",
             description="a multi-turn episode's return: the sum of its environment's turn rewards")
    register("function", "unirl.rewards:load_function_reward", config_class=FunctionRewardConfig,
             description="any TRL-style (prompts, completions, **kw) or verl-style compute_score function, "
                         "by import path or .py file")


@hookimpl
def unirl_register_rollouts(register):
    register("hf_generate", "unirl.rollouts.hf_generate:HFGenerateRollout", config_class=HFGenerateConfig,
             description="Hugging Face generate() with KV cache, in the trainer's process")
    register("vllm", "unirl.rollouts.vllm_engine:VLLMRollout", config_class=VLLMConfig,
             description="vLLM in its own process and environment (scripts/setup_vllm_env.sh): token ids in and "
                         "out, weights pushed through shared memory")
    register("sglang", "unirl.rollouts.sglang_engine:SGLangRollout", config_class=SGLangConfig,
             description="SGLang: refused with the reason where it does not run (docs/rollouts.md); "
                         "scripts/gpu/sglang.sh measures it on a GPU")


@hookimpl
def unirl_register_buffers(register):
    register("memory", "unirl.buffers.memory:MemoryBuffer", config_class=MemoryBufferConfig,
             description="in-memory FIFO of rollout batches, saved in checkpoints")
    register("prioritized", "unirl.buffers.prioritized:PrioritizedBuffer", config_class=PrioritizedBufferConfig,
             description="trains each step on the best fraction of what was generated, ranked by a recipe-chosen "
                         "score (reward, reward_std, length)")


@hookimpl
def unirl_register_loggers(register):
    register("tensorboard", "unirl.loggers.tensorboard_logger:TensorBoardLogger", config_class=TensorBoardLoggerConfig,
             description="TensorBoard scalars in <run.dir>/tensorboard (every metrics.jsonl number)")
    register("wandb", "unirl.loggers.wandb_logger:WandbLogger", config_class=WandbLoggerConfig,
             description="Weights & Biases; offline by default (no network), the run id kept for resume")
    register("mlflow", "unirl.loggers.mlflow_logger:MlflowLogger", config_class=MlflowLoggerConfig,
             description="MLflow; a local SQLite store in <run.dir>/mlflow.db by default, or any tracking_uri")


@hookimpl
def unirl_register_environments(register):
    register("calculator", "unirl.environments.calculator:CalculatorEnvironment", config_class=CalculatorConfig,
             description="integer arithmetic with a calc(EXPR) tool; the answer after the tool's result is scored")
    register("openenv", "unirl.environments.openenv:OpenEnvEnvironment", config_class=OpenEnvConfig,
             description="an OpenEnv Environment (or client) in process, unchanged: the model's text as its Action")

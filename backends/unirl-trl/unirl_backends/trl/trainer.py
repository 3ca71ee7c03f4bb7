"""The unirl trainer object for ``backend=trl``.

Runs (``run_stage``): each stage is one TRL trainer (``SFTTrainer`` for sft and cpt,
``DPOTrainer``, ``GRPOTrainer``) built from :func:`unirl_backends.trl.translate.stage_config`
on the stage's data, trained by TRL's own loop; :class:`UnirlCallback` reports each optimizer
step to the driver. The policy is one in-memory model carried from stage to stage, and so is
the AdamW state (as on the native backend).

Fixed batches (``fixed_step``, :class:`unirl.protocols.FixedBatchSteps`; conformance L2): the same TRL
trainers, but the step is driven by hand: TRL's loss code on the given batch
(``Trainer.training_step`` for SFT and DPO, ``GRPOTrainer.compute_loss`` on precomputed
completions for RL, since its ``training_step`` would generate), then clipping and the
optimizer TRL's ``create_optimizer`` built from the translated config.

Exact resume: a stage samples all its examples when it starts and records the task's
position before; a resumed stage restores that position, samples the same examples and
skips the finished steps; the random generator continues from the checkpoint's state (see
:mod:`unirl_backends.trl.callback`). An uninterrupted stage draws what plain TRL draws.
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from unirl.errors import ConfigError, RunError
from unirl.protocols import BuildContext, StageInputs
from unirl.tasks.rng import RngState
from unirl.trainers import HFModels, Lora, ModelSet, Recipe
from unirl_backends.trl.translate import stage_config, use_cuda


class _DropIntendedWarnings:
    """TRL warns that ``loss_type='luspo'`` usually goes with sequence-level importance
    sampling; unirl uses its token-level form on purpose (``seq_mean_token_sum``)."""

    def filter(self, record: Any) -> bool:
        return "'luspo'" not in record.getMessage()


def quiet_trl() -> None:
    """No second progress display and no telemetry; TRL's other warnings still show."""
    import logging
    import os

    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import datasets
    from transformers.utils import logging as hf_logging

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    trl_logger = logging.getLogger("trl.trainer.grpo_trainer")
    if not any(isinstance(f, _DropIntendedWarnings) for f in trl_logger.filters):
        trl_logger.addFilter(_DropIntendedWarnings())


class TRLTrainer:
    def __init__(self, ctx: BuildContext, options: dict[str, Any] | None = None) -> None:
        quiet_trl()
        self.recipe, self.options = ctx.recipe, dict(options or {})
        self.model_path, self.run_dir = ctx.model_path, Path(ctx.run_dir)
        self.tokenizer = ctx.tokenizer or HFModels.load_tokenizer(ctx.model_path)
        self.cuda = use_cuda(self.options)
        if self.options.get("use_vllm"):
            self._check_vllm()
        self.policy = HFModels.load_causal_lm(ctx.model_path, self.recipe.model.dtype)
        self.lora = Lora.section(self.recipe)
        if self.lora is not None:  # a PeftModel, which TRL's trainers take as the model (grpo_trainer.py:164-176)
            self.policy = Lora.wrap(self.policy, self.lora, seed=self.recipe.seed)
        if self.cuda:
            self.policy.to("cuda")
        self.policy.train()
        self.reference: Any = None  # frozen stage-start policy (dpo; rl with kl_loss_coef > 0)
        self.optimizer_state: dict[str, Any] | None = None  # AdamW state carried between stages
        self.stage_task_state: dict[str, Any] | None = None  # task position when the stage started
        self._live: Any = None  # the TRL trainer running the current stage
        self._steppers: dict[tuple[str, int], Any] = {}

    def _check_vllm(self) -> None:
        import importlib.util

        if not self.cuda:
            raise ConfigError("backend_options.use_vllm=true needs a CUDA device; none is available here. Drop "
                              "use_vllm (TRL then generates with transformers).", key="backend_options.use_vllm",
                              value=True)
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("backend_options.use_vllm=true needs the vllm package, which is not installed. "
                              "pip install vllm, or drop use_vllm.", key="backend_options.use_vllm", value=True)

    # ------------------------------------------------------------------ models

    def policy_module(self) -> Any:
        return self.policy

    def _frozen_copy(self) -> Any:
        ref = copy.deepcopy(self.policy).eval()
        vars(ref).pop("forward", None)
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def begin_stage(self, stage_type: str) -> None:
        self.stage_task_state = None  # recorded by run_stage when the stage samples its data
        self.reference = self._frozen_copy() if Recipe.stage_needs(self.recipe, stage_type).reference else None

    def _unpatch(self) -> None:
        """TRL adds a fused LM head by assigning ``model.forward`` on the instance; drop it so
        the next stage (and the export) see the plain model."""
        vars(self.policy).pop("forward", None)

    def _build(self, stage_type: str, config: Any, dataset: Any, reward: Any = None, callbacks: Any = None,
               columns: tuple[str, ...] = ()) -> Any:
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        import trl

        common = dict(args=config, train_dataset=dataset, processing_class=self.tokenizer, callbacks=callbacks)
        if stage_type in ("sft", "cpt"):
            trainer = trl.SFTTrainer(model=self.policy, **common)
        elif stage_type == "dpo":
            trainer = trl.DPOTrainer(model=self.policy, ref_model=self.reference, **common)
        else:
            from unirl_backends.trl.data import trl_reward

            name = str(self.recipe.reward.get("name", "reward"))
            factory = None
            if self.recipe.environment.get("name") is not None:  # multi-turn: TRL's environment_factory
                from unirl_backends.trl.environment import environment_class, episode_reward

                factory = environment_class(self.recipe)
                funcs = [episode_reward(reward, name, columns)]
            else:
                funcs = [trl_reward(reward, name, columns)] if reward is not None else [
                    lambda prompts, completions, **kw: [0.0] * len(prompts)]
            trainer = self._grpo(config, funcs, common, factory)
        for cb in (PrinterCallback, ProgressCallback):  # unirl prints progress; TRL must not print a second one
            trainer.remove_callback(cb)
        return trainer

    def _grpo(self, config: Any, funcs: list[Any], common: dict[str, Any], environment_factory: Any = None) -> Any:
        """GRPOTrainer loads its reference from the policy's ``config._name_or_path``: point it
        at the stage-start weights written to the run directory, then restore the name."""
        import trl

        original = self.policy.config._name_or_path
        if config.beta > 0:
            if self.reference is None:
                raise RunError("the rl stage needs a reference model (kl_loss_coef > 0) but none was frozen")
            ref_dir = self.run_dir / "trl" / "reference"
            HFModels.save(self.reference, self.tokenizer, str(ref_dir))
            self.policy.config._name_or_path = str(ref_dir)
        try:
            extra = {"environment_factory": environment_factory} if environment_factory is not None else {}
            return trl.GRPOTrainer(model=self.policy, reward_funcs=funcs, **common, **extra)
        finally:
            self.policy.config._name_or_path = original

    # ------------------------------------------------------------------ trainer mode

    def run_stage(self, stage: Any, lr: float, *, parts: StageInputs, start_step: int, on_step: Any) -> str | None:
        from datasets import Dataset

        from unirl_backends.trl.callback import UnirlCallback
        from unirl_backends.trl.data import stage_rows

        if start_step == 0:
            self.stage_task_state = parts.task.state_dict()
        elif self.stage_task_state is None:
            raise RunError(f"stage {stage.name!r} resumes at step {start_step} but the checkpoint does not hold the "
                           f"task position of the stage's start; it was not written by backend 'trl'")
        else:
            parts.task.load_state_dict(self.stage_task_state)
        examples = parts.task.sample(stage.steps * stage.batch_size)
        rows = stage_rows(stage.type, examples)[start_step * stage.batch_size:]
        multi_turn = stage.type == "rl" and self.recipe.environment.get("name") is not None
        if multi_turn:  # TRL's environments take conversational prompts (the task's text as the user's message)
            rows = [{**row, "prompt": [{"role": "user", "content": row["prompt"]}]} for row in rows]
        config = stage_config(self.recipe, stage, output_dir=str(self.run_dir / "trl" / stage.name),
                              steps=stage.steps - start_step, options=self.options, lr=lr)
        if self.options.get("dry_run"):
            return self._dry_run(stage, config, rows, multi_turn)
        # a resumed stage continues the generator stream of the interrupted one (restored by the driver)
        rng = RngState.torch() if start_step > 0 else None
        callback = UnirlCallback(stage_type=stage.type, on_step=on_step, optimizer_state=self.optimizer_state,
                                 rng_state=rng, completions_per_step=stage.batch_size * self.recipe.algorithm.group_size)
        columns = tuple(k for k in rows[0] if k != "prompt") if rows else ()
        trainer = self._build(stage.type, config, Dataset.from_list(rows), parts.reward, [callback], columns)
        self._live = trainer
        try:
            trainer.train()
        finally:
            if trainer.optimizer is not None:
                self.optimizer_state = copy.deepcopy(trainer.optimizer.state_dict())
            self._live = None
            self._unpatch()

    def _dry_run(self, stage: Any, config: Any, rows: list[dict[str, Any]], multi_turn: bool) -> str:
        """``backend_options.dry_run``: the stage's TRL config, rows and (multi-turn) environment_factory
        module written to ``run.dir/trl/NAME/``, and the trainer call printed; nothing is trained."""
        import json

        from omegaconf import OmegaConf

        out = self.run_dir / "trl" / stage.name
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(config.to_json_string())
        (out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        model = "model" if self.lora is None else (f"get_peft_model(model, LoraConfig(r={self.lora.rank}, lora_alpha="
                                                   f"{self.lora.alpha}, target_modules={list(self.lora.target_modules)}))")
        call = f"trl.{type(config).__name__.replace('Config', 'Trainer')}({model}, args=config, train_dataset=rows"
        if multi_turn:
            pinned = OmegaConf.merge(self.recipe, {"backend_options": {"dry_run": False}})
            (out / "recipe.yaml").write_text("# written by unirl for the environment_factory (environment.py)\n"
                                             + OmegaConf.to_yaml(pinned))
            (out / "environment.py").write_text(
                '"""TRL environment_factory for this unirl recipe\'s environment (written by '
                'unirl_backends.trl.trainer)."""\n'
                "from unirl.config import load_recipe\n"
                "from unirl_backends.trl.environment import environment_class\n\n"
                f"UnirlEnvironment = environment_class(load_recipe({str(out / 'recipe.yaml')!r}))\n")
            call += ", reward_funcs=[episode_reward(...)], environment_factory=environment.UnirlEnvironment"
        print(f"[trl] {stage.name}: {call}); files in {out}", flush=True)
        return "dry_run"

    # ------------------------------------------------------------------ fixed-batch steps (conformance L2)

    def _stepper(self, stage_type: str, n: int) -> Any:
        """A TRL trainer configured for a step over ``n`` sequences (pairs for dpo, completions for rl)."""
        from datasets import Dataset

        key = (stage_type, n)
        if key not in self._steppers:
            group = self.recipe.algorithm.group_size if stage_type == "rl" else 1
            if n % group:
                raise ValueError(f"an rl step of {n} sequences is not whole groups of algorithm.group_size={group}")
            stage = SimpleNamespace(name=f"l2-{stage_type}", type=stage_type, steps=1, batch_size=n // group, lr=None)
            config = stage_config(self.recipe, stage, output_dir=str(self.run_dir / "trl" / stage.name),
                                  options=self.options)
            rows = {"sft": [{"prompt": "1+1=", "completion": "2"}], "cpt": [{"text": "1+1=2"}],
                    "dpo": [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}], "rl": [{"prompt": "1+1="}]}
            trainer = self._build(stage_type, config, Dataset.from_list(rows[stage_type]))
            trainer.create_optimizer()
            self._steppers[key] = trainer
        return self._steppers[key]

    @staticmethod
    def _optimizer_step(trainer: Any, lr: float) -> float:
        for group in trainer.optimizer.param_groups:
            group["lr"] = lr
        params = [p for p in trainer.model.parameters() if p.grad is not None]
        if trainer.args.max_grad_norm and trainer.args.max_grad_norm > 0:
            norm = trainer.accelerator.clip_grad_norm_(params, trainer.args.max_grad_norm)
        else:
            norm = ModelSet.grad_norm(params, None)
        trainer.optimizer.step()
        trainer.model.zero_grad(set_to_none=True)
        return float(norm)

    def _hf_steps(self, trainer: Any, micro_inputs: list[dict[str, Any]], lr: float) -> tuple[float, float]:
        """HF's own accumulation: ``num_items_in_batch`` over the window, ``training_step`` per micro-batch."""
        trainer.current_gradient_accumulation_steps = len(micro_inputs)
        num_items = trainer._get_num_items_in_batch(micro_inputs, trainer.args.device)
        total = 0.0
        for inputs in micro_inputs:
            total += float(trainer.training_step(trainer.model, inputs, num_items))
        return total, self._optimizer_step(trainer, lr)

    def fixed_step(self, stage_type: str, batch: Any, lr: float) -> dict[str, float]:
        """One optimizer step on ``batch`` (conformance L2): TRL's loss code on the given batch."""
        if stage_type in ("sft", "cpt"):
            return self._lm_step(stage_type, batch, lr)
        if stage_type == "dpo":
            return self._dpo_step(batch, lr)
        if stage_type == "rl":
            return self._policy_step(batch, lr)
        raise ConfigError(f"stages.type={stage_type!r}: backend 'trl' runs sft, cpt, dpo and rl stages",
                          key="stages.type", value=stage_type)

    def _lm_step(self, stage_type: str, batch: Any, lr: float) -> dict[str, float]:
        trainer = self._stepper(stage_type, len(batch))
        size = trainer.args.per_device_train_batch_size
        labels = batch.input_ids.masked_fill(batch.loss_mask == 0, -100)
        micro = [{"input_ids": batch.input_ids[i:i + size], "attention_mask": batch.attention_mask[i:i + size],
                  "labels": labels[i:i + size]} for i in range(0, len(batch), size)]
        loss, norm = self._hf_steps(trainer, micro, lr)
        return {"loss/lm": loss, "grad/norm": norm, "lr": lr, "tokens/trained": float(batch.loss_mask[:, 1:].sum())}

    def _dpo_step(self, pairs: Any, lr: float) -> dict[str, float]:
        import torch

        n, seqs = len(pairs), pairs.sequences
        trainer = self._stepper("dpo", n)
        size = trainer.args.per_device_train_batch_size
        micro = []
        for i in range(0, n, size):
            rows = torch.cat([torch.arange(i, min(i + size, n)), torch.arange(n + i, n + min(i + size, n))])
            micro.append({"input_ids": seqs.input_ids[rows], "attention_mask": seqs.attention_mask[rows],
                          "completion_mask": seqs.loss_mask[rows]})
        loss, norm = self._hf_steps(trainer, micro, lr)
        return {"loss/dpo": loss, "grad/norm": norm, "lr": lr}

    def _policy_step(self, batch: Any, lr: float) -> dict[str, float]:
        if batch.advantages is None:
            raise ValueError("an rl fixed_step needs batch.advantages")
        trainer = self._stepper("rl", len(batch))
        size = trainer.args.per_device_train_batch_size
        trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
        p = batch.prompt_len
        completion_mask = batch.response_mask[:, p:].int()
        # dapo's normaliser: the token count of the whole generation batch (this step)
        num_items = completion_mask.sum()
        total = 0.0
        for i in range(0, len(batch), size):
            sl = slice(i, i + size)
            inputs = {"prompt_ids": batch.input_ids[sl, :p], "prompt_mask": batch.attention_mask[sl, :p],
                      "completion_ids": batch.input_ids[sl, p:], "completion_mask": completion_mask[sl],
                      "advantages": batch.advantages[sl, p - 1:], "num_items_in_batch": num_items}
            if batch.old_logprobs is not None:
                inputs["old_per_token_logps"] = batch.old_logprobs[sl, p - 1:]
            if trainer.beta != 0.0:
                inputs["ref_per_token_logps"] = batch.ref_logprobs[sl, p - 1:]
            loss = trainer.compute_loss(trainer.model, inputs)
            trainer.accelerator.backward(loss)
            total += float(loss.detach())
        norm = self._optimizer_step(trainer, lr)
        return {"loss/total": total, "grad/norm": norm, "lr": lr, "tokens/trained": float(num_items)}

    # ------------------------------------------------------------------ state

    def _saved(self, model: Any) -> dict[str, Any]:
        """A model's state as a checkpoint keeps it (of a LoRA policy, the adapters alone)."""
        state = model.state_dict()
        return Lora.adapter_state(state) if self.lora is not None else state

    def _load(self, model: Any, state: dict[str, Any]) -> None:
        model.load_state_dict({**model.state_dict(), **state} if self.lora is not None else state)

    def state_dict(self) -> dict[str, Any]:
        models = {"policy": self._saved(self.policy)}
        if self.reference is not None:
            models["reference"] = self._saved(self.reference)
        live = self._live.optimizer if self._live is not None and self._live.optimizer is not None else None
        optimizer = live.state_dict() if live is not None else self.optimizer_state
        return {"models": models, "optimizers": {"policy": optimizer} if optimizer is not None else {},
                "stage_task_state": self.stage_task_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        models = state["models"]
        self._load(self.policy, models["policy"])
        self.reference = None
        if "reference" in models:
            self.reference = self._frozen_copy()
            self._load(self.reference, models["reference"])
        self.optimizer_state = state["optimizers"].get("policy")
        self.stage_task_state = state.get("stage_task_state")

    def export(self, run_dir: str) -> dict[str, str]:
        self._unpatch()
        path = str(Path(run_dir) / "model")
        if self.lora is None:
            HFModels.save(self.policy, self.tokenizer, path)
            return {"policy": path}
        Lora.save_adapter(self.policy, str(Path(run_dir) / "adapter"))  # PEFT's adapter, then the merged model
        HFModels.save(Lora.merged(self.policy), self.tokenizer, path)
        return {"policy": path, "adapter": str(Path(run_dir) / "adapter")}

    def close(self) -> None:
        self._live = None
        self._steppers.clear()

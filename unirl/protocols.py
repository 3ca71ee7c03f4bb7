"""The interfaces between the parts of a run: the backend contract. Backends and plugins implement them.

A backend builds one of two kinds of trainer (docs/architecture.md):

- :class:`EngineTrainer` (engine mode): unirl's driver runs the loop. One rl step is
  ``Task.sample`` -> ``RolloutEngine.generate`` -> ``RewardFn`` -> ``ReplayBuffer.add`` /
  ``take`` -> ``EngineTrainer.score`` (old / reference log-probs, values, in one pass) ->
  advantages (``Backend.math()``, an :class:`AlgorithmMath`) -> ``EngineTrainer.update``
  (every epoch, mini-batch and micro-batch, policy and critic) -> ``EngineTrainer.sync_weights``.
  Three calls into the trainer per step, whatever ``ppo_epochs``, ``mini_batches`` and
  ``micro_batch_size`` are. A supervised step (sft, cpt, dpo, rm) is one ``supervised_step``.
- :class:`StageRunner` (trainer mode): the framework's own trainer runs a whole stage and
  calls back after each optimizer step (metrics, stop, checkpoint).

What only the conformance kit needs is separate: :class:`FixedBatchSteps` (one optimizer step
on a given batch, for stage runners; an engine trainer answers it through ``update``) and
:class:`ConfigTranslator` (``translate`` / ``read_back`` on the backend object).

:func:`unirl.contract.check_trainer` checks a built trainer against these protocols, so a
missing method is a plugin error naming the plugin and the method.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from unirl.batch import PairBatch, RolloutBatch, SFTBatch, TokenLossBatch, TokenLossResult


@dataclass
class Example:
    """One task item: a prompt, its reference answer, the SFT (and preferred) completion,
    optionally a dispreferred completion for preference stages, and any extra fields that
    reward functions receive as keyword lists."""

    prompt: str
    answer: str
    completion: str
    rejected: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The example as raw text, for continued pretraining."""
        return self.prompt + self.completion

    @staticmethod
    def require_rejected(examples: Sequence[Example]) -> None:
        """Preference stages need a dispreferred completion on every example."""
        missing = [ex.prompt for ex in examples if ex.rejected is None]
        if missing:
            raise ValueError(f"preference stages need examples with a rejected completion; {missing[0]!r} has none")


# -------------------------------------------------------------------------------------------
# Components: task, reward, rollout, buffer
# -------------------------------------------------------------------------------------------


@runtime_checkable
class Task(Protocol):
    """A dataset of prompts with references (``task.name``).

    Optional: :class:`ValidationExamples` (``validation(limit)``), the held-out examples that
    ``eval.every`` scores; a task without it cannot be evaluated during training (refused at recipe load)."""

    def sample(self, n: int) -> list[Example]:
        """``n`` examples, drawn from the task's own seeded generator."""

    def state_dict(self) -> dict[str, Any]:
        """The data position (generator state), JSON-serialisable, for exact resume."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class MetricsLogger(Protocol):
    """Where a run's metrics go besides ``metrics.jsonl`` (``loggers`` in the recipe)."""

    def log(self, row: dict[str, Any], step: int) -> None:
        """One row, as written to ``metrics.jsonl``, at global step ``step`` (numbers and strings)."""

    def close(self, status: str) -> None:
        """The run ended with ``status`` (``completed``, ``stopped``, ``failed``, ...): flush and let go."""


@runtime_checkable
class RewardFn(Protocol):
    """TRL's reward signature; rewards are floats, one per completion."""

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **kwargs: Any) -> list[float]: ...


@dataclass
class SamplingParams:
    n: int = 1  # completions per prompt
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    min_p: float = 0.0  # 0: no min-p filter
    #: strings that end a completion: the token completing one is its last (kept in the mask)
    stop: list[str] = field(default_factory=list)
    greedy: bool = False  # argmax decoding (evaluation); temperature, top_p and top_k are not used
    #: also return each sampled token's log-prob under the sampling policy
    #: (``RolloutBatch.rollout_logprobs``; truncated importance sampling needs them)
    logprobs: bool = False
    #: which: ``raw`` (log-softmax of the logits) or ``processed`` (after temperature and filters)
    logprob_kind: str = "raw"


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates completions with the current policy (``rollout.name``).

    An engine either samples with the trainer's own module (it answers :class:`SharesTrainerPolicy`
    with True: it took ``EngineTrainer.policy_module()`` at build time, and weight sync sends
    nothing) or keeps its own copy, which ``load_weights`` refreshes after each update.
    Optional members, each a protocol of its own: :class:`SharesTrainerPolicy`,
    :class:`TokenGenerator`, :class:`ExampleRollout`, :class:`GenerationPool`,
    :class:`CountsSequences`, :class:`HoldsTokenizer`, :class:`CountedCalls`, :class:`Closeable`.
    """

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> RolloutBatch:
        """Completions for every prompt, ``params.n`` each, grouped contiguously."""

    def default_params(self, n: int) -> SamplingParams:
        """The sampling parameters of the recipe's ``rollout`` section, with ``n`` samples per prompt."""

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Replace the engine's copy of the policy (full tensors by parameter name, on CPU)."""

    def state_dict(self) -> dict[str, Any]:
        """What exact resume needs (e.g. the next group index), JSON-serialisable."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class StepResult:
    """What :meth:`Environment.step` returns for one action (OpenEnv's and gym's fields)."""

    #: text shown to the model next (a tool's output); appended as tokens after the model's own,
    #: masked out of the loss. Ignored when ``done``.
    observation: str = ""
    reward: float = 0.0  # this turn's reward (summed into the episode's return, docs/semantics.md)
    done: bool = False  # the episode is over: no more turns
    #: counters the rollout adds to the step's row: ``tool_calls`` and ``tool_errors`` (numbers)
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """A multi-turn environment (``environment.name``): one instance per episode, built by the
    registered factory as ``factory(config, ctx)``.

    Token in, token out: the rollout appends the tokens the engine generated and the tokenised
    ``observation`` of each step to the episode's sequence; it never re-tokenises the conversation.
    Only the model's own tokens are trained on (``response_mask``); observations are context.
    Optional: :class:`ToolSchemas` (``tools``, the tools it offers) and :class:`TurnStops`
    (``stop``, the strings that end a model turn).
    """

    def reset(self, example: Example, seed: int) -> str | None:
        """Start an episode for ``example``; ``seed`` is the episode's own (the same on a resumed
        run). Returns the prompt text the model starts from, or None for ``example.prompt``."""

    def step(self, action: str) -> StepResult:
        """The model's turn (its decoded text, special tokens removed): the next observation, the
        turn's reward and whether the episode is over."""


@runtime_checkable
class ReplayBuffer(Protocol):
    """Holds rollouts between generation and training, and decides what is trained on (``buffer.name``).

    Each rl step adds the batch it generated (rewards set), then asks ``take()`` what to
    train on: the buffer chooses which sequences and in what order, and removes them; anything it
    neither returns nor keeps is dropped (the step records ``buffer/dropped``). The FIFO
    ``memory`` buffer returns everything it holds, oldest first; ``prioritized`` the best
    fraction by a score. The number returned must suit the update: a multiple of
    ``algorithm.mini_batches`` x ``parallel.dp`` (check it in the options' ``validate``).
    """

    def add(self, batch: RolloutBatch) -> None: ...

    def take(self, n_sequences: int | None = None) -> RolloutBatch:
        """Remove and return what to train on next, in the order to train on it: the buffer's
        choice when ``n_sequences`` is None, else exactly ``n_sequences`` sequences (FIFO
        buffers: the oldest, in insertion order). Every field of a returned row is as added."""

    def __len__(self) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


# -------------------------------------------------------------------------------------------
# What one rl step asks of an engine trainer
# -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoreRequest:
    """What :meth:`EngineTrainer.score` must compute for a batch (all in one pass)."""

    #: behaviour log-probs of the current policy: needed when the batch is reused
    #: (``ppo_epochs x mini_batches > 1``) or the KL enters the reward
    old_logprobs: bool = False
    #: log-probs under the frozen reference (the stage keeps one: KL in the loss or the reward)
    ref_logprobs: bool = False
    #: critic values (``advantage=gae``)
    values: bool = False


@dataclass
class Scores:
    """Per-token tensors ``[B, T-1]`` on unirl's target grid (slot ``j`` scores token ``j + 1``).

    A trainer may return old log-probs it was not asked for (verl recomputes them on-policy as
    its own trainer does); a requested field must not be None."""

    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None

    def cpu(self) -> Scores:
        """The same scores on the CPU, where the driver's math runs (a trainer on a GPU returns these)."""
        return Scores(*(t.cpu() if t is not None else None for t in (self.old_logprobs, self.ref_logprobs,
                                                                     self.values)))


@dataclass(frozen=True)
class UpdatePlan:
    """One rl step's update: ``len(orders)`` epochs, each ``mini_batches`` optimizer steps over
    the batch in ``orders[epoch]`` order; each mini-batch steps the policy at ``lr`` and, with
    ``critic``, the critic at ``critic_lr``. Micro-batching is the trainer's
    (``trainer.micro_batch_size``); the normaliser is each mini-batch's own, so an update does
    not depend on it. Built by the driver (:func:`unirl.engine.update.plan_update`), which draws
    the orders from the run's generator, so every backend sees the same mini-batches."""

    lr: float
    orders: tuple[torch.Tensor, ...]
    mini_batches: int = 1
    critic: bool = False
    critic_lr: float | None = None

    @property
    def optimizer_steps(self) -> int:
        return len(self.orders) * self.mini_batches

    def mini_batch_indices(self) -> list[torch.Tensor]:
        """The index tensor of every mini-batch, in the order they are trained."""
        n = len(self.orders[0])
        per = n // self.mini_batches
        return [order[k * per:(k + 1) * per] for order in self.orders for k in range(self.mini_batches)]


@dataclass(frozen=True)
class AdamStep:
    """One optimizer step of the gradient summed since the last (the Tinker API's ``optim_step``):
    AdamW with these settings for this step (decoupled weight decay, as ``torch.optim.AdamW``),
    the global gradient norm clipped to ``grad_clip`` first (None: not clipped)."""

    lr: float
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip: float | None = None

    def apply(self, optimizer: Any) -> None:
        """Set this step's settings on every param group of a torch-style optimizer."""
        for group in optimizer.param_groups:
            group.update(lr=self.lr, betas=(self.beta1, self.beta2), eps=self.eps, weight_decay=self.weight_decay)


# -------------------------------------------------------------------------------------------
# Trainers
# -------------------------------------------------------------------------------------------


@runtime_checkable
class TrainerBase(Protocol):
    """What every trainer a backend builds answers: models, state and export."""

    tokenizer: Any

    def begin_stage(self, stage_type: str) -> None:
        """Create what a stage needs at its first step: reference snapshot, critic, reward model."""

    def state_dict(self) -> dict[str, Any]:
        """``{"models": {name: tensors}, ...}``: model tensors are saved as safetensors."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def export(self, run_dir: str) -> dict[str, str]:
        """Write trained models as Hugging Face directories (safetensors); returns name -> path."""

    def close(self) -> None:
        """Release processes, groups and memory; the driver calls it once, even after a failure."""


@runtime_checkable
class EngineTrainer(TrainerBase, Protocol):
    """Engine mode: owns the models (policy, and as stages need them reference, critic, reward
    model) and their optimizers; unirl's driver runs the loop. Losses follow the reference
    semantics of :mod:`unirl.algorithms`."""

    def supervised_step(self, stage_type: str, batch: SFTBatch | PairBatch, lr: float) -> dict[str, float]:
        """One optimizer step of a non-rl stage: ``sft`` / ``cpt`` (an SFTBatch: token-mean NLL on
        ``batch.loss_mask``; the row's loss key is ``loss/lm``), ``dpo`` or ``rm`` (a PairBatch)."""

    def score(self, batch: RolloutBatch, request: ScoreRequest) -> Scores:
        """Everything the step needs from the models before the update, in one pass, without
        gradient and without changing ``batch``."""

    def update(self, batch: RolloutBatch, plan: UpdatePlan) -> dict[str, float]:
        """The whole update of one rl step (``batch`` has advantages, and returns for the critic):
        every optimizer step of ``plan``; returns the metrics averaged over those steps."""

    def sync_weights(self, rollout: RolloutEngine) -> dict[str, float]:
        """Bring ``rollout``'s policy to the trainer's weights. Sends nothing when the rollout
        shares the trainer's module or already has this version; returns the bytes sent
        (``weights/sync_bytes``)."""

    def policy_module(self) -> Any:
        """The in-process policy module a same-process rollout may share, or None."""


@runtime_checkable
class TokenLossSteps(Protocol):
    """An engine trainer that sums the gradient of per-token losses over calls and steps it when
    asked: what ``unirl serve`` (the Tinker API) needs of a backend. ``forward_backward`` adds the
    gradient of ``batch``'s loss (a sum over tokens: nothing divided by micro-batch or call counts)
    to the policy's, or only scores with ``forward_only``; ``optim_step`` steps the sum and clears
    it, returning at least ``grad/norm`` (before clipping)."""

    def forward_backward(self, batch: TokenLossBatch, *, forward_only: bool = False) -> TokenLossResult: ...

    def optim_step(self, step: AdamStep) -> dict[str, float]: ...


@dataclass(frozen=True)
class StageInputs:
    """What a stage runner gets from the run besides the stage itself: the run's task (its data
    position is the run's, saved with every checkpoint) and its reward (checked, under the run's
    ``reward.on_error`` policy)."""

    task: Task
    reward: RewardFn


@runtime_checkable
class StageRunner(TrainerBase, Protocol):
    """Trainer mode: the framework's own trainer runs each stage (TRL's trainers; verl's
    ``main_ppo`` and OpenRLHF's Ray trainer on GPU)."""

    def run_stage(self, stage: Any, lr: float, *, parts: StageInputs, start_step: int,
                  on_step: Callable[[dict[str, float]], bool]) -> str | None:
        """Train ``stage`` from ``start_step`` (a resumed stage skips finished steps). Call
        ``on_step(row)`` after every optimizer step: it records metrics, writes checkpoints and
        returns True when the framework's loop must stop now. Return None, or ``"dry_run"`` when
        the stage was only prepared (files written, command printed) and nothing was trained."""


@runtime_checkable
class FixedBatchSteps(Protocol):
    """Conformance L2 only: one optimizer step on a given batch, for trainers whose own loop
    cannot be handed a batch (stage runners). Engine trainers answer L2 through ``update``."""

    def fixed_step(self, stage_type: str, batch: Any, lr: float) -> dict[str, float]:
        """``rl``: a RolloutBatch with advantages, old and reference log-probs; otherwise as
        :meth:`EngineTrainer.supervised_step`."""


# -------------------------------------------------------------------------------------------
# The backend object
# -------------------------------------------------------------------------------------------


@runtime_checkable
class MathAggregate(Protocol):
    """The framework's loss aggregation (``algorithm.loss_agg``): conformance L1 compares it."""

    def aggregate(self, loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: int) -> torch.Tensor: ...


@runtime_checkable
class MathAdvantages(Protocol):
    """The framework's advantage estimators (``algorithm.advantage``): conformance L1 compares them."""

    def advantages(self, algo: Any, scores: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor,
                   values: torch.Tensor | None = None, kl: torch.Tensor | None = None) -> torch.Tensor: ...


@runtime_checkable
class MathAdvantagesAndReturns(Protocol):
    """Advantages and the critic's returns in one call: what an engine-mode rl step computes with."""

    def advantages_and_returns(self, algo: Any, scores: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor,
                               values: torch.Tensor | None = None, kl: torch.Tensor | None = None,
                               ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


@runtime_checkable
class MathKL(Protocol):
    """The framework's KL estimators (in the reward for engine-mode runs; L1 compares them)."""

    def kl(self, logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str, clamp: float | None) -> torch.Tensor: ...


@runtime_checkable
class MathPolicyLoss(Protocol):
    """The framework's policy loss (``algorithm.policy_loss`` and its knobs): conformance L1 compares it."""

    def policy_loss(self, algo: Any, logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                    advantages: torch.Tensor, mask: torch.Tensor, entropy: torch.Tensor | None,
                    norm_length: int, rollout_logp: torch.Tensor | None = None) -> torch.Tensor:
        """The step's policy loss. ``rollout_logp`` (only passed when the backend claims
        ``algorithm.tis_cap``): the rollout engine's log-probs, for truncated importance sampling."""


@runtime_checkable
class MathValueLoss(Protocol):
    """The framework's critic loss (``algorithm.value_clip``): conformance L1 compares it."""

    def value_loss(self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                   clip: float | None) -> torch.Tensor: ...


@runtime_checkable
class MathDPOLoss(Protocol):
    """The framework's preference loss (``algorithm.dpo_loss``): conformance L1 compares it."""

    def dpo_loss(self, pi_c: torch.Tensor, pi_r: torch.Tensor, ref_c: torch.Tensor, ref_r: torch.Tensor, *,
                 beta: float, loss_type: str, label_smoothing: float) -> torch.Tensor: ...


@runtime_checkable
class AlgorithmMath(MathAggregate, MathAdvantages, MathAdvantagesAndReturns, MathKL, MathPolicyLoss, MathValueLoss,
                    MathDPOLoss, Protocol):
    """A framework's own functions behind unirl's canonical math (reference:
    :class:`unirl.algorithms.reference.ReferenceMath`). Engine-mode runs compute the KL in the
    reward and the advantages with it; conformance L1 compares every method to the reference.

    Each method is a protocol of its own (``MathAggregate`` ... ``MathDPOLoss``) because a
    trainer-mode framework's adapter offers only the functions its framework has: the kit checks
    each claimed knob with ``isinstance(math, MathPolicyLoss)`` and so on, and fails a claimed knob
    whose method is absent. Optional beyond these: :class:`MathOverlongPenalty`,
    :class:`PolicyLossNames`."""


# -------------------------------------------------------------------------------------------
# Optional members: what a part may also offer, each a protocol of its own (found with
# ``isinstance``, never by probing for a name). The driver adds nothing when a part lacks one.
# -------------------------------------------------------------------------------------------


@runtime_checkable
class RankMetrics(Protocol):
    """A trainer on several ranks: each rl and supervised step's row gets ``rank_metrics()``, the
    ranks' peak memory (``memory/rank_peak_bytes``) and, with ``profile.collectives``, ``comm/*``."""

    def rank_metrics(self) -> dict[str, float]: ...


@runtime_checkable
class CountedCalls(Protocol):
    """A rollout or reward served by worker pools (Ray): what the workers answered since the last
    call and how many were replaced (``rollout/worker_restarts``), added to the step's row."""

    def take_counts(self) -> dict[str, float]: ...


@runtime_checkable
class ConfigImporter(Protocol):
    """A framework's own configuration read into a recipe (``BackendSpec.importer``, ``unirl import``):
    ``from_args(source, args)`` reads what the framework's user has (a file and arguments) with the
    framework's parser and defaults; ``from_native(native)`` maps the parsed configuration the
    backend's ``translate`` writes, so ``from_native(translate(recipe))`` gives the recipe's knobs back.
    Both return a :class:`unirl.importing.ImportedRecipe`."""

    def from_args(self, source: str | None, args: list[str]) -> Any: ...

    def from_native(self, native: dict[str, Any]) -> Any: ...


@runtime_checkable
class TokenGenerator(Protocol):
    """A rollout engine that also samples from token ids (multi-turn episodes need it: the
    episode's context is the ids generated so far plus observations, never re-tokenised text)."""

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                     seeds: Sequence[int]) -> list[tuple[list[int], list[float] | None]]:
        """One sample per prompt (``params.n`` is ignored): the sampled ids (up to and including EOS
        or the token completing a stop string) and, with ``params.logprobs``, each one's log-prob.
        ``seeds[i]`` seeds prompt ``i``'s sample where the engine seeds per request (vLLM); an engine
        drawing from the process's torch generator (hf_generate) may ignore it."""


@runtime_checkable
class FailureLog(Protocol):
    """A reward that counts its failures by kind (``reward.on_error``): the run's totals in run.json."""

    def take_failures(self) -> Mapping[str, int]: ...


@runtime_checkable
class Closeable(Protocol):
    """A rollout or reward that holds processes or actors: closed once when the run ends."""

    def close(self) -> None: ...


@runtime_checkable
class DirectBaselines(Protocol):
    """A backend whose framework can run the recipe's job on its own, for ``unirl bench``: the argv
    of the same job through ``unirl run`` and with the framework alone (:mod:`unirl.bench.direct`),
    or None when it offers none for this recipe."""

    def direct_baseline(self, recipe: Any, recipe_path: str, overrides: list[str], workdir: Any,
                        steps: int) -> Any: ...


@runtime_checkable
class AloneLoops(Protocol):
    """A backend whose framework can drive the plain process's loop alone, for ``unirl bench --baseline plain``
    (:mod:`unirl.bench.plain`): ``(module, settings)``, or None when it offers none for this recipe. The plain
    process (``unirl/bench/plain_process.py``, which imports nothing of unirl) imports ``module``, which must import
    nothing of the ``unirl`` package either, and calls its ``make(Loop, path=, seed=, **settings)``: the loop class
    over ``Loop`` (:class:`unirl.bench.simple_loop.SimpleLoop` with ``freeze_reference`` and ``sync_weights``),
    computing what ``unirl run`` computes on this backend (the bench checks the weights both end with)."""

    def alone_loop(self, recipe: Any) -> tuple[str, dict[str, Any]] | None: ...


# Rollout engines


@runtime_checkable
class SharesTrainerPolicy(Protocol):
    """A rollout engine that says whether it samples with the trainer's in-process policy module
    itself (it took ``EngineTrainer.policy_module()`` at build time). Read by the driver (no
    rollout log-probs are asked for: same weights, no train-inference gap) and by weight sync (it
    sends nothing). Absent: the engine keeps a copy of its own, as if False."""

    #: True when the engine samples with the trainer's in-process policy module itself
    shares_trainer_policy: bool


def shares_trainer_policy(rollout: object) -> bool:
    """Whether ``rollout`` samples with the trainer's own module (:class:`SharesTrainerPolicy`):
    the one place that reads the optional member, for the driver, weight sync and wrappers."""
    return isinstance(rollout, SharesTrainerPolicy) and bool(rollout.shares_trainer_policy)


@runtime_checkable
class ExampleRollout(Protocol):
    """A rollout that plays whole examples rather than prompts (the multi-turn rollout of
    ``environment.name``: each environment starts from its example). The generation queue and
    ``eval.every`` call it instead of ``generate``. Absent: ``generate(prompts, params)``."""

    def generate_examples(self, examples: Sequence[Example], params: SamplingParams) -> RolloutBatch:
        """``params.n`` episodes per example, grouped contiguously, as ``generate`` returns them."""


@runtime_checkable
class GenerationPool(Protocol):
    """A rollout whose calls run elsewhere (vLLM's engine process, Ray rollout workers): the
    generation queue sends a batch's calls with ``submit`` and trains meanwhile, then waits with
    ``collect``. Absent: the queue calls ``generate`` and the batch is made at once, in process."""

    def submit(self, prompts: Sequence[str], params: SamplingParams, *, immediate: bool = False) -> Any:
        """Send the calls and return at once: a ticket for :meth:`collect`. ``immediate``: the batch
        is wanted right away (nothing ahead in the queue), so the pool may carry the driver's random state."""

    def collect(self, ticket: Any) -> RolloutBatch:
        """The batch of ``submit``'s calls, in prompt order (waiting for them)."""


@runtime_checkable
class CountsSequences(Protocol):
    """A rollout that counts the sequences a step took from it (``rollout/sequences``, Ray pools):
    the generation queue tells it each batch it hands a step. Absent: nothing is counted."""

    def count_sequences(self, n: int) -> None: ...


@runtime_checkable
class HoldsTokenizer(Protocol):
    """A rollout that holds the run's tokenizer: dynamic sampling pads the batches it joins with its
    ``pad_token_id``. Absent (or None): padding id 0, which the attention mask hides anyway."""

    tokenizer: Any


# Trainers


@runtime_checkable
class ReportsLogprobDiff(Protocol):
    """An engine trainer whose ``update`` measures the train-inference gap itself
    (``rollout/logprob_diff_*``) on a batch it trains once without old log-probs: True saves the rl
    step a scoring forward, and then the update's row must carry the metrics (checked). Absent or
    False: the step scores the old log-probs to measure it."""

    reports_logprob_diff: bool


# Rewards


@runtime_checkable
class PolicedReward(Protocol):
    """A reward called under the recipe's reward policy (:class:`unirl.rewards.checked.CheckedReward`,
    what the driver builds): ``policy.on_error`` decides whether failed groups are left out of the
    rl step and whether rows carry ``reward/failed``. Absent: ``on_error=fail`` (a failure raises)."""

    #: a :class:`unirl.config.sections.RewardPolicy` (``on_error``, ``isolation``, ...)
    policy: Any


@runtime_checkable
class DeclaredRange(Protocol):
    """A reward function that declares the range of its scores: the run and the conformance kit
    check every score against it. Absent (or None): only finiteness is checked."""

    #: ``(low, high)``, inclusive, or None
    reward_range: tuple[float, float] | None


def declared_range(fn: object) -> tuple[float, float] | None:
    """The score range a reward function declares (:class:`DeclaredRange`), or None: the one place that
    reads the optional member, for the reward wrappers, Ray's reward workers and the kit's checks."""
    return fn.reward_range if isinstance(fn, DeclaredRange) else None


# Environments


@runtime_checkable
class ToolSchemas(Protocol):
    """An environment that advertises tools to the model (chat templates, frameworks' tool loops).
    Absent: it offers none."""

    #: JSON schemas in the OpenAI function format
    #: (``{"type": "function", "function": {"name", "description", "parameters"}}``); may be empty
    tools: list[dict[str, Any]]


@runtime_checkable
class TurnStops(Protocol):
    """An environment whose answers are triggered by strings the model writes (e.g.
    ``"</tool_call>"``): rollouts add them to the turn's stop strings. Absent: a turn ends at EOS
    or ``rollout.max_new_tokens`` only."""

    stop: list[str]


# Tasks and options (checked on the registered class, at recipe load)


@runtime_checkable
class ValidationExamples(Protocol):
    """A task with held-out examples: ``eval.every`` scores them. Checked on the task's class when
    the recipe is loaded (``issubclass``); absent: a recipe with ``eval.every`` is refused."""

    def validation(self, limit: int | None = None) -> list[Example]:
        """The first ``limit`` held-out examples (all when None), always the same ones."""


@runtime_checkable
class ValidatedOptions(Protocol):
    """A plugin's options class (``config_class``) with its own check, run at recipe load after
    types and keys: a returned string is a ConfigError naming the section. ``validate(cfg)``, or
    ``validate(cfg, recipe)`` to read the rest of the recipe. Checked on the class
    (``issubclass``); absent: types and keys only."""

    @staticmethod
    def validate(cfg: Any, recipe: Any = None) -> str | None: ...


# Algorithm math (on what ``Backend.math()`` returns)


@runtime_checkable
class MathOverlongPenalty(Protocol):
    """The framework's own overlong-response shaping (``algorithm.overlong_buffer``): the rl step
    adds it to the rewards, and conformance L1 compares it. Absent: unirl's
    :func:`unirl.algorithms.length_penalty.overlong_penalty` (and L1 fails a claim of the knob
    unless it is emulated)."""

    def overlong_penalty(self, lengths: torch.Tensor, max_new_tokens: int, buffer: int, factor: float
                         ) -> torch.Tensor: ...


@runtime_checkable
class PolicyLossNames(Protocol):
    """A math adapter that says what the framework calls each ``algorithm.policy_loss`` value
    (shown with conformance L1's results). Absent: unirl's names are shown."""

    #: ``{unirl value: the framework's own setting}``
    policy_loss_names: Mapping[str, str]


@dataclass
class BuildContext:
    """What factories receive besides their own config section."""

    recipe: Any
    run_dir: str
    model_path: str
    tokenizer: Any = None
    trainer: EngineTrainer | StageRunner | None = None
    start_step: int = 0  # the global step a run starts (or resumes) after: a logger's first row is the next
    #: the Ray rollout worker building this component (``rollout.workers``), None in the driver's
    #: process: an engine holding a process of its own names its log and its errors by it
    worker: int | None = None


@runtime_checkable
class Backend(Protocol):
    """What ``backend=NAME`` builds: the training side of a run."""

    name: str

    def build_trainer(self, ctx: BuildContext) -> EngineTrainer | StageRunner:
        """An :class:`EngineTrainer` or a :class:`StageRunner` (the run's mode follows from which)."""

    def math(self) -> AlgorithmMath:
        """The framework's math (L1, and the advantages / reward KL of engine-mode runs)."""


@runtime_checkable
class ConfigTranslator(Protocol):
    """Conformance L0, on the backend object: the recipe as the framework's native config."""

    def translate(self, recipe: Any) -> Any:
        """The recipe as the framework's native config (accepted by its own parser)."""

    def read_back(self, native: Any) -> list[tuple[str, Any]]:
        """The canonical ``(knob, value)`` pairs recovered from a native config."""


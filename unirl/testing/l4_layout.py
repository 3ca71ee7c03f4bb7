"""L4: the same update whatever the layout. Every L2 step (sft, dpo, rm, rl, critic) again on each
layout of :data:`LAYOUTS` the backend declares (data, tensor and pipeline parallel, ZeRO stages,
offload, micro-batches by a token budget, padding-free packed micro-batches), against the same one-process oracle and within the same float32
tolerances (``TOLERANCES["L2.float32"]``): data-parallel ranks, shards and micro-batching must
not change the loss, the gradient norm or the update. A layout the backend does not declare is a
reported skip."""

from __future__ import annotations

from functools import partial

from unirl.testing.l2_step import _critic_case, _rl_case, _stage_case
from unirl.testing.results import Case

#: the layouts every backend is asked for (each a set of ``parallel.*`` overrides)
LAYOUTS: tuple[tuple[str, ...], ...] = (
    ("parallel.dp=2",),
    ("parallel.dp=2", "parallel.zero_stage=2"),
    ("parallel.dp=2", "parallel.zero_stage=3", "parallel.offload=optimizer"),
    ("parallel.tp=2",),
    ("parallel.pp=2",),
    ("trainer.max_tokens_per_micro_batch=20",),  # micro-batches by a token budget (L2's batch: 2-3 rows each)
    ("trainer.packing=true",),  # padding-free: each micro-batch's rows as one sequence, attention kept within rows
)


#: layouts that change only some steps' forwards, and those steps: packing packs the policy's and the
#: reference's forwards (a reward model's and a critic's stay padded: their cells would repeat L2's)
ONLY: dict[tuple[str, ...], tuple[str, ...]] = {("trainer.packing=true",): ("rl", "sft", "dpo")}


def cases() -> list[Case]:
    out = []
    for layout in LAYOUTS:
        shown = " ".join(layout)
        steps = ONLY.get(layout, ("rl", "sft", "dpo", "rm", "critic"))
        out += [*([Case(f"rl_step[algorithm.loss_agg=token_mean][{shown}]", "L4",
                         partial(_rl_case, mode="token_mean", layout=layout))] if "rl" in steps else []),
                *(Case(f"{stage}_step[{shown}]", "L4", partial(_stage_case, stage=stage, layout=layout))
                  for stage in ("sft", "dpo", "rm") if stage in steps),
                *([Case(f"critic_step[{shown}]", "L4", partial(_critic_case, layout=layout))]
                  if "critic" in steps else [])]
    return out

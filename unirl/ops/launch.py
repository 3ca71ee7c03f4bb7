"""``unirl launch RECIPE [key=value ...] --target local|ray|slurm|k8s``: the job that runs a recipe where
it is to run, written (and started where it can be).

- ``local``: ``unirl run`` here.
- ``slurm``: ``OUT/job.sbatch``: one task per node, ``srun torchrun`` with a c10d rendezvous on the first
  node over the recipe's layout (``parallel.dp x tp x pp`` ranks split evenly over ``--nodes``; unirl's
  launched mode, :mod:`unirl.distributed.torchrun`), ``resume=auto`` and ``--requeue`` so a preempted job
  continues. ``sbatch OUT/job.sbatch`` submits it.
- ``k8s``: ``OUT/rayjob.yaml``: a KubeRay ``RayJob`` whose head pod holds the trainer's ranks (its GPUs)
  and whose worker pods (``--nodes`` - 1) serve the run's Ray rollout and reward workers; the entrypoint
  joins that cluster (``distributed.ray.address=auto``). ``kubectl apply -f OUT/rayjob.yaml`` starts it.
- ``ray``: submits ``unirl run`` to a running Ray cluster's job API (``--address``, default
  ``http://127.0.0.1:8265``) and prints the job id; the recipe and paths must be readable there.

Every target first loads the recipe (exit 2 on a user error) and checks the layout fits the resources.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unirl.errors import ConfigError

TARGETS = ("local", "ray", "slurm", "k8s")


@dataclass
class Resources:
    nodes: int = 1
    cpus: int = 8  # per node (Slurm: per task; k8s: per pod)
    memory: str = "64Gi"  # per pod (k8s); Slurm takes --mem from the partition's default
    time: str = "24:00:00"
    partition: str | None = None
    image: str = "unirl:latest"
    namespace: str = "default"
    port: int = 29500
    address: str = "http://127.0.0.1:8265"
    gpus: bool = True  # GPUs per node = the ranks on that node (Slurm, k8s)


def world_size(recipe: Any) -> int:
    p = recipe.parallel
    return int(p.dp) * int(p.get("tp", 1) or 1) * int(p.get("pp", 1) or 1)


def ranks_per_node(recipe: Any, res: Resources) -> int:
    world = world_size(recipe)
    if res.nodes < 1 or world % res.nodes:
        raise ConfigError(f"--nodes {res.nodes}: the recipe's layout has {world} ranks (parallel.dp x tp x pp), which "
                          f"do not split evenly over {res.nodes} nodes. Use a node count that divides {world}, or "
                          f"change parallel.dp.", key="nodes", value=res.nodes)
    return world // res.nodes


def _run_args(recipe_path: str, overrides: list[str]) -> list[str]:
    return [str(Path(recipe_path).resolve()), *overrides]


def slurm_script(recipe: Any, recipe_path: str, overrides: list[str], res: Resources, out: Path) -> str:
    per_node = ranks_per_node(recipe, res)
    name = Path(str(recipe.run.dir)).name or "run"
    args = " ".join(shlex.quote(a) for a in [*_run_args(recipe_path, overrides), "resume=auto"])
    lines = ["#!/bin/bash", f"#SBATCH --job-name=unirl-{name}", f"#SBATCH --nodes={res.nodes}",
             "#SBATCH --ntasks-per-node=1", f"#SBATCH --cpus-per-task={res.cpus}", f"#SBATCH --time={res.time}",
             f"#SBATCH --output={out.resolve()}/slurm-%j.out", "#SBATCH --requeue"]  # OUT exists at sbatch time
    if res.gpus:
        lines.append(f"#SBATCH --gpus-per-node={per_node}")
    if res.partition:
        lines.append(f"#SBATCH --partition={res.partition}")
    lines += ["# written by `unirl launch --target slurm`: one task per node, torchrun starts the node's ranks",
              f"# layout: {world_size(recipe)} ranks (parallel.dp x tp x pp) = {res.nodes} nodes x {per_node}",
              "set -euo pipefail",
              'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              f"mkdir -p {shlex.quote(str(Path(str(recipe.run.dir)).resolve()))}",
              f'srun torchrun --nnodes="$SLURM_NNODES" --nproc_per_node={per_node} --rdzv_id="$SLURM_JOB_ID" '
              f'--rdzv_backend=c10d --rdzv_endpoint="$head_node:{res.port}" -m unirl run {args}']
    return "\n".join(lines) + "\n"


def rayjob_manifest(recipe: Any, recipe_path: str, overrides: list[str], res: Resources) -> dict[str, Any]:
    per_node = ranks_per_node(recipe, res) if res.nodes == 1 else world_size(recipe)
    name = "unirl-" + "".join(c if c.isalnum() else "-" for c in (Path(str(recipe.run.dir)).name or "run").lower())
    limits: dict[str, Any] = {"cpu": str(res.cpus), "memory": res.memory}
    if res.gpus:
        limits["nvidia.com/gpu"] = per_node

    def pod(container: str, gpus: bool) -> dict[str, Any]:
        lim = dict(limits) if gpus else {k: v for k, v in limits.items() if k != "nvidia.com/gpu"}
        return {"spec": {"containers": [{"name": container, "image": res.image,
                                          "resources": {"limits": lim, "requests": lim}}]}}

    entry = " ".join(shlex.quote(a) for a in ["python", "-m", "unirl", "run", recipe_path, *overrides,
                                              "distributed.ray.address=auto", "resume=auto"])
    spec: dict[str, Any] = {
        "entrypoint": entry, "shutdownAfterJobFinishes": True,
        "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0"},
                                             "template": pod("ray-head", res.gpus)}}}
    if res.nodes > 1:
        spec["rayClusterSpec"]["workerGroupSpecs"] = [{
            "groupName": "workers", "replicas": res.nodes - 1, "minReplicas": res.nodes - 1,
            "maxReplicas": res.nodes - 1, "rayStartParams": {}, "template": pod("ray-worker", res.gpus)}]
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": name[:63], "namespace": res.namespace},
            "spec": spec}


def submit_ray(recipe_path: str, overrides: list[str], res: Resources) -> str:
    """Submit ``unirl run`` to the Ray cluster's job API at ``res.address``; returns the job id."""
    from ray.job_submission import JobSubmissionClient

    try:
        client = JobSubmissionClient(res.address)
    except Exception as exc:  # noqa: BLE001 - the client's own connection errors
        raise ConfigError(f"--target ray: no Ray job API at {res.address!r} ({type(exc).__name__}: {exc}). Start a "
                          f"cluster (ray start --head) or give --address http://HEAD:8265.", key="address",
                          value=res.address) from None
    entry = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "unirl", "run",
                                              *_run_args(recipe_path, overrides)])
    return str(client.submit_job(entrypoint=entry))


def launch(recipe_path: str, overrides: list[str], target: str, out: Path, res: Resources) -> tuple[int, str]:
    """``(exit code, what was written or started)``."""
    from unirl.config import load_recipe

    if target not in TARGETS:
        raise ConfigError(f"--target {target!r}; allowed: {', '.join(TARGETS)}", key="target", value=target)
    recipe = load_recipe(recipe_path, overrides)
    if target == "local":  # a process of its own, as a scheduler would start it
        import subprocess

        code = subprocess.run([sys.executable, "-m", "unirl", "run", recipe_path, *overrides], check=False).returncode
        return code, f"ran here (exit {code})"
    out.mkdir(parents=True, exist_ok=True)
    if target == "slurm":
        path = out / "job.sbatch"
        path.write_text(slurm_script(recipe, recipe_path, overrides, res, out))
        path.chmod(0o755)
        return 0, f"wrote {path}: submit it with `sbatch {path}`"
    if target == "k8s":
        from omegaconf import OmegaConf

        path = out / "rayjob.yaml"
        path.write_text(OmegaConf.to_yaml(OmegaConf.create(rayjob_manifest(recipe, recipe_path, overrides, res))))
        return 0, f"wrote {path}: start it with `kubectl apply -f {path}` (KubeRay's operator runs RayJobs)"
    job = submit_ray(recipe_path, overrides, res)
    return 0, f"submitted to {res.address} as job {job}: follow it with `ray job logs -f {job} --address {res.address}`"

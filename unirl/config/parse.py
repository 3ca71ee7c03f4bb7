"""Parse a recipe: the schema's defaults, the YAML file and ``key=value`` overrides merged into one
DictConfig, every key and type checked against the schema (OmegaConf struct mode), every error a
ConfigError naming the key, the value, where it came from and what is allowed.

Nothing here knows the installed plugins: a component section's options are merged as given and
checked by :mod:`unirl.config.validate`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf import errors as oc_errors

from unirl.config import choices
from unirl.config.schema import COMPONENT_SECTIONS, RecipeConfig
from unirl.errors import ConfigError, did_you_mean


def parse_recipe(path: str | os.PathLike[str] | None, overrides: Sequence[str] = ()) -> DictConfig:
    """The recipe at ``path`` (None: the schema's defaults) with ``overrides`` applied, keys and types
    checked, not yet validated against the plugins."""
    cfg = OmegaConf.structured(RecipeConfig)
    OmegaConf.set_struct(cfg, True)
    for section in (*COMPONENT_SECTIONS, "backend_options"):
        OmegaConf.set_struct(cfg[section], False)  # options are checked against the plugin's class later
    if path is not None:
        _merge_checked(cfg, _read_yaml(Path(path)), source=str(path))
    for item in overrides:
        key, value = _parse_override(item)
        _update_checked(cfg, key, value)
    _check_missing(cfg)
    return cfg


# --------------------------------------------------------------------------- reading


def _read_yaml(path: Path) -> Any:
    import io

    from unirl.userfiles import read_text

    if not path.exists():
        hint = ""
        if path.parent.is_dir():
            near = did_you_mean(path.name, [p.name for p in path.parent.glob("*.yaml")])
            hint = near.replace("Did you mean '", f"Did you mean '{path.parent}/") if near else ""
        raise ConfigError(
            f"recipe file {str(path)!r} does not exist.{hint} Pass the path of a YAML recipe, "
            f"e.g. `unirl run configs/grpo_tiny.yaml`.", key="recipe", value=str(path),
        )
    text = read_text(path, key="recipe", fix="Pass the path of a YAML recipe, e.g. `unirl run configs/grpo_tiny.yaml`.")
    try:
        data = OmegaConf.load(io.StringIO(text))
    except Exception as exc:  # noqa: BLE001 - YAML parser errors
        raise ConfigError(f"recipe file {str(path)!r} is not valid YAML: {exc}", key="recipe", value=str(path)) from exc
    if not isinstance(data, DictConfig):
        raise ConfigError(f"recipe file {str(path)!r} must hold a mapping of keys at the top level, "
                          f"got {type(data).__name__}.", key="recipe", value=str(path))
    return data


def _parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item or item.startswith("="):
        raise ConfigError(
            f"override {item!r} is not of the form key=value (for example trainer.lr=1e-4).", key=item, value=item
        )
    key, raw = item.split("=", 1)
    key = key.strip()
    # OmegaConf's own YAML reading, so 1e-3 is a float and null is None, as in a recipe file.
    try:
        return key, OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]))["v"]
    except Exception as exc:  # noqa: BLE001 - yaml's scanner/parser errors, OmegaConf's grammar errors
        problem = " ".join(str(exc).split())[:240]
        raise ConfigError(
            f"override {item!r}: the value {raw!r} is not valid YAML ({type(exc).__name__}: {problem}). Quote the "
            f"whole argument for the shell and write the value as in a recipe file, e.g. "
            f"'{key}=[1, 2]' or '{key}={{name: x, option: 1}}'; a string with YAML characters goes in quotes: "
            f"{key}='\"a: b\"'.", key=key, value=raw) from None


# --------------------------------------------------------------------------- errors


def _allowed_keys(cfg: Any, full_key: str) -> list[str]:
    parent_key = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    node = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if isinstance(node, DictConfig):
        return [str(k) for k in node.keys()]
    return []


def translate_error(exc: Exception, cfg: Any, key: str, value: Any, source: str, prefix: str = "") -> ConfigError:
    """An OmegaConf error as a one-paragraph ConfigError; ``prefix`` is the section path of ``cfg``."""
    where = f" (in {source})" if source else ""
    shown = f"{prefix}{key}"
    if isinstance(exc, (oc_errors.ConfigKeyError, oc_errors.ConfigAttributeError)):
        allowed = _allowed_keys(cfg, key)
        leaf = shown.rsplit(".", 1)[-1]
        parent = shown.rsplit(".", 1)[0] if "." in shown else "the top level"
        return ConfigError(
            f"unknown key {shown!r}{where}.{did_you_mean(leaf, allowed)} "
            f"Keys allowed at {parent}: {', '.join(sorted(allowed)) or '(none)'}.", key=shown, value=value,
        )
    if isinstance(exc, oc_errors.ValidationError):
        expected = _expected_type(cfg, key)
        return ConfigError(
            f"{shown}={value!r}{where} has the wrong type: expected {expected}. Write e.g. "
            f"{shown}={_example(expected)}.", key=shown, value=value,
        )
    return ConfigError(f"{shown}={value!r}{where}: {exc}", key=shown, value=value)


def _expected_type(cfg: Any, key: str) -> str:
    try:
        node = cfg._get_node(key) if "." not in key else OmegaConf.select(cfg, key.rsplit(".", 1)[0])._get_node(
            key.rsplit(".", 1)[1])
        ref = node._metadata.ref_type
        name = getattr(ref, "__name__", str(ref))
        return f"{name} or null" if node._metadata.optional and name != "Any" else name
    except Exception:  # noqa: BLE001 - best effort for the message only
        return "a value of the declared type"


def _example(expected: str) -> str:
    return {"float": "0.001", "int": "8", "bool": "true", "str": "name"}.get(expected.split()[0], "VALUE")


def _merge_checked(cfg: Any, data: Any, source: str) -> None:
    flat = flatten(OmegaConf.to_container(data))
    try:
        cfg.merge_with(data)
    except (oc_errors.ConfigKeyError, oc_errors.ConfigAttributeError, oc_errors.ValidationError) as exc:
        key = getattr(exc, "full_key", None) or ""
        raise translate_error(exc, cfg, key, flat.get(key, getattr(exc, "value", None)), source) from None


def _check_list_indices(cfg: Any, key: str, value: Any) -> None:
    node, walked = cfg, []
    for part in key.split("."):
        if isinstance(node, ListConfig):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(
                    f"{key}={value!r}: {'.'.join(walked)} has {len(node)} entries (indices 0 to {len(node) - 1}); "
                    f"{part!r} is not one of them.", key=key, value=value)
        elif not isinstance(node, DictConfig) or part not in node:
            return
        node = node[int(part)] if isinstance(node, ListConfig) else node[part]
        walked.append(part)


def _kept_keys(section: str) -> tuple[str, ...]:
    """The keys of a component section an engine swap keeps: the run's (the driver's) and, for a
    rollout, the sampling knobs every engine shares (an engine without one refuses it by name)."""
    if section == "rollout":
        from unirl.config.sections import SAMPLING_KEYS

        return (*_driver_keys(section), *SAMPLING_KEYS)
    return _driver_keys(section)


def _driver_keys(section: str) -> tuple[str, ...]:
    """The keys of a component section that are the run's (the driver's), not the plugin's."""
    if section == "reward":
        from unirl.config.sections import POLICY_KEYS

        return POLICY_KEYS
    if section == "rollout":
        from unirl.config.sections import ROLLOUT_POLICY_KEYS

        return ROLLOUT_POLICY_KEYS
    if section == "environment":
        from unirl.config.sections import AGENT_POLICY_KEYS

        return AGENT_POLICY_KEYS
    return ()


def _swap_component(cfg: Any, key: str, value: Any) -> None:
    """An override that names another plugin for a component section (``task.name=dataset`` or
    ``task={name: dataset, ...}``) starts that section afresh, as a Hydra config-group swap does:
    the options the recipe gave the previous plugin are its own and are dropped (the driver's keys,
    such as ``reward.isolation``, and a rollout's sampling knobs, such as ``rollout.max_new_tokens``,
    stay)."""
    section, _, leaf = key.partition(".")
    if section not in COMPONENT_SECTIONS or leaf not in ("", "name"):
        return
    new = value.get("name") if leaf == "" and isinstance(value, dict) else value if leaf == "name" else None
    named_none = leaf == "name" or (leaf == "" and isinstance(value, dict) and "name" in value)
    if section == "environment" and new is None and named_none:  # back to single-turn: no options left
        cfg[section] = {"name": None}
        return
    if not isinstance(new, str) or new == cfg[section].get("name"):
        return
    kept = {k: v for k, v in OmegaConf.to_container(cfg[section]).items() if k in _kept_keys(section)}
    cfg[section] = {"name": new, **kept}


def _update_checked(cfg: Any, key: str, value: Any) -> None:
    _check_list_indices(cfg, key, value)
    _swap_component(cfg, key, value)
    try:
        OmegaConf.update(cfg, key, value, merge=True)
    except (oc_errors.ConfigKeyError, oc_errors.ConfigAttributeError, oc_errors.ValidationError) as exc:
        raise translate_error(exc, cfg, key, value, "command line") from None
    except (IndexError, oc_errors.ConfigIndexError) as exc:
        raise ConfigError(f"{key}={value!r}: {exc}; index within the list, e.g. stages.0.steps=10.",
                          key=key, value=value) from None


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Every node of nested dicts/lists by dotted path (``stages.0.steps``), containers included."""
    out: dict[str, Any] = {}
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for k, v in items:
        full = f"{prefix}{k}"
        out[full] = v
        out.update(flatten(v, full + "."))
    return out


def _check_missing(cfg: Any) -> None:
    if not cfg.stages:
        raise ConfigError("stages is empty: a recipe needs at least one stage, e.g. "
                          "stages: [{name: grpo, type: grpo, steps: 100}].", key="stages", value=[])
    for i, stage in enumerate(cfg.stages):
        for fld in ("name", "type", "steps"):
            if OmegaConf.is_missing(stage, fld):
                raise ConfigError(f"stages.{i}.{fld} is required and missing. Each stage needs name, type "
                                  f"(one of {', '.join(choices.STAGE_TYPES)}) and steps.",
                                  key=f"stages.{i}.{fld}", value=None)



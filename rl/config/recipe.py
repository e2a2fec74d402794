"""Recipes: typed, frozen, nested config sections, loaded from YAML plus ``key=value`` overrides.

The public names of the recipe, gathered from the modules that do each job, so that
``from rl.config.recipe import ...`` serves every caller:

* ``rl/config/fields.py``: typed fields (``knob``: type, bounds, doc) and the builder from plain data;
* ``rl/config/schema.py``: the sections and ``Recipe``; ``rl/config/algo.py``: the ``algo`` section,
  a tagged union on ``algo.name`` (an estimator's own settings exist only when it is chosen);
  ``rl/config/adaptive.py``: ``mixer.adaptive``;
* ``rl/config/loading.py``: ``load_recipe`` / ``recipe_from_dict`` (YAML, overrides, errors naming
  the key and its line), ``RecipeError``; ``rl/config/migrations.py``: keys of older layouts;
* ``rl/config/rules.py``: the rules that span sections; ``rl/config/validate.py``: ``validate_recipe``
  (those rules, then the world: model, classes, vLLM engine arguments); ``rl/config/task_files.py``:
  the task files, loaded once for all their checks; ``rl/config/cluster_checks.py``: the ``cluster``
  section; ``rl/config/output_dir.py``: the output dir (writable, room, a run already there);
* ``rl/config/docgen.py``: ``docs/recipe-reference.md`` from the declarations.
"""

from __future__ import annotations

from rl.config.adaptive import MIXER_MODES, AdaptiveConfig, MixerMode
from rl.config.algo import (
    AlgoConfig,
    CriticConfig,
    DiscountConfig,
    GroupAlgoConfig,
    KLConfig,
    LossAgg,
    LossConfig,
    OptimConfig,
    PPOConfig,
    ReinforcePPConfig,
    ReturnsConfig,
    RewardNormConfig,
    UpdateConfig,
    UserAlgoConfig,
)
from rl.config.cluster_checks import check_cluster
from rl.config.loading import (
    FREE_FORM_DICTS,
    RecipeError,
    load_recipe,
    recipe_from_dict,
    recipe_to_dict,
    resolve_path,
)
from rl.config.migrations import OLD_NORMALIZATIONS, RENAMED
from rl.config.output_dir import (
    STOPPED_FILE,
    checkpoint_bytes_estimate,
    holds_run,
    newest_checkpoint,
    output_dir_problem,
    resolve_output_dir,
)
from rl.config.rules import cross_section_rules
from rl.config.schema import (
    DATASET_TARGETS,
    EMBEDDED_MODELS,
    ENGINE_LORA_MODULES,
    ENGINE_MAX_LORA_RANK,
    HUB_ID,
    RESERVED_RESOURCES,
    ClusterConfig,
    DataConfig,
    DatasetConfig,
    Dtype,
    EnvSpec,
    FaultsConfig,
    LearnerConfig,
    LoraConfig,
    MixerConfig,
    ModelConfig,
    Recipe,
    RewardServiceConfig,
    RewardSpec,
    RolloutConfig,
    RunConfig,
    TrainConfig,
    WandbConfig,
)
from rl.config.task_files import check_task_files
from rl.config.validate import ENGINE_KWARGS_OWNED, check_engine_kwargs, validate_recipe, vllm_engine_arg_names

__all__ = [
    "MIXER_MODES",
    "AdaptiveConfig",
    "MixerMode",
    "AlgoConfig",
    "CriticConfig",
    "DiscountConfig",
    "GroupAlgoConfig",
    "KLConfig",
    "LossAgg",
    "LossConfig",
    "OptimConfig",
    "PPOConfig",
    "ReinforcePPConfig",
    "ReturnsConfig",
    "RewardNormConfig",
    "UpdateConfig",
    "UserAlgoConfig",
    "check_cluster",
    "FREE_FORM_DICTS",
    "RecipeError",
    "load_recipe",
    "recipe_from_dict",
    "recipe_to_dict",
    "resolve_path",
    "OLD_NORMALIZATIONS",
    "RENAMED",
    "STOPPED_FILE",
    "checkpoint_bytes_estimate",
    "holds_run",
    "newest_checkpoint",
    "output_dir_problem",
    "resolve_output_dir",
    "cross_section_rules",
    "DATASET_TARGETS",
    "EMBEDDED_MODELS",
    "ENGINE_LORA_MODULES",
    "ENGINE_MAX_LORA_RANK",
    "HUB_ID",
    "RESERVED_RESOURCES",
    "ClusterConfig",
    "DataConfig",
    "DatasetConfig",
    "Dtype",
    "EnvSpec",
    "FaultsConfig",
    "LearnerConfig",
    "LoraConfig",
    "MixerConfig",
    "ModelConfig",
    "Recipe",
    "RewardServiceConfig",
    "RewardSpec",
    "RolloutConfig",
    "RunConfig",
    "TrainConfig",
    "WandbConfig",
    "check_task_files",
    "ENGINE_KWARGS_OWNED",
    "check_engine_kwargs",
    "validate_recipe",
    "vllm_engine_arg_names",
]

"""The run's config: one section per component, validated before any work starts.

The YAML files under configs/ compose (with Hydra, in cli/) into a plain dict; `Config.from_dict`
builds the typed sections from it (an option section, data/aug/objective, as the option its `name`
picks, schema/typed.py) and `validate` fills the input size from the data set and runs each
section's checks. `from_saved` reads a config a checkpoint or an exported file carries, written by
this version or an earlier one (schema/legacy.py). No torch here, nor in the options' own modules, which
the registry imports on its first lookup (schema/typed.py `load_options`); vit_train/config/ gives the public name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vit_train.errors import ConfigError
from vit_train.schema import legacy
from vit_train.schema.sections import (
    AugConfig,
    CallbackConfig,
    DataConfig,
    LoggerConfig,
    ModelConfig,
    ObjectiveConfig,
    OptimConfig,
    RunConfig,
    ScheduleConfig,
    SweepConfig,
    TrainerConfig,
)
from vit_train.schema.typed import (
    Section,
    build,
    build_listed,
    chooser,
    default_option,
    field_types,
    option_base,
    options,
    section_keys,
)

OPTION_GROUPS = ("model", "data", "aug", "optim", "schedule", "objective")  # the sections whose keys are the option's
LIST_GROUPS = ("logger", "callbacks")  # list groups: any number of their options, each section under its name


def _default(group: str):
    return field(default_factory=lambda: default_option(group)())


@dataclass
class Config:
    model: ModelConfig = _default("model")  # the chosen model family's section (vit_train/models/families/)
    data: DataConfig = _default("data")  # the chosen data set's section (vit_train/data/sources/)
    aug: AugConfig = _default("aug")  # the chosen augmentation's (vit_train/data/aug/)
    optim: OptimConfig = _default("optim")  # the chosen optimiser's (vit_train/optim/)
    schedule: ScheduleConfig = _default("schedule")  # the chosen schedule's (vit_train/schedules/)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    objective: ObjectiveConfig = _default("objective")  # the chosen objective's (vit_train/objectives/)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    seed: int = 0  # seeds the model init, data order and augmentation
    resume: str | None = None  # null, auto (newest checkpoint in the run dir), or a path
    name: str = ""  # free-form run name: in train.log, results.json and a sweep's summary.csv
    tags: list[str] = field(default_factory=list)  # free-form labels: in train.log, results.json, summary.csv
    # where the numbers go besides metrics.jsonl (logger=[tensorboard,wandb,mlflow]): {option name: its keys}
    logger: dict[str, LoggerConfig] = field(
        default_factory=lambda: build_listed(LoggerConfig, ["tensorboard"], "logger", [])
    )
    callbacks: dict[str, CallbackConfig] = field(
        default_factory=dict
    )  # callbacks=[early_stopping]: {option name: its keys}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Config:
        """Build a validated config from plain data (Hydra's composed config, a user's dict). Raises
        ConfigError (one line) for an unknown key (a key of another option of the group names that
        option), a value of the wrong type, or a combination that cannot run."""
        data = plain_data(data)  # an OmegaConf DictConfig or another mapping: its plain dicts and lists
        if isinstance(data, dict):
            legacy.refuse_old_sections(data)  # mae: {...} at the top: one line naming objective.*
        return build(cls, data, "", known_keys()).validate()

    @classmethod
    def from_saved(cls, data: dict[str, Any], source: Any = None) -> Config:
        """`from_dict` of a config a checkpoint or an exported file carries, from this version or an earlier
        one (whose sections held every option's keys, and mae.*/distill.* at the top: schema/legacy.py).
        `source` (the file) is named in its ConfigError, as what holds the config."""
        try:
            return cls.from_dict(legacy.upgrade_saved(data))
        except ConfigError as e:
            if source is None:
                raise
            missing = [
                (group, section[chooser(group)])
                for group in OPTION_GROUPS
                for section in [data.get(group)]
                if isinstance(section, dict)
                and isinstance(section.get(chooser(group)), str)
                and section[chooser(group)] not in options(group)
            ]
            missing += [
                (group, f"[{name}]")  # a list group's option: callbacks=[mine]
                for group in LIST_GROUPS
                for section in [data.get(group)]
                if isinstance(section, dict)
                for name in section
                if name not in options(group)
            ]
            if missing:  # a run of another package's option (docs/extending.md)
                group, name = missing[0]
                spelled = group if group in LIST_GROUPS or chooser(group) == "name" else f"{group}.{chooser(group)}"
                raise ConfigError(
                    f"{source} was trained with {spelled}={name}, which is not registered here: install "
                    f"the package that has it (docs/extending.md), then run the same command"
                ) from None
            raise ConfigError(
                f"{source} holds a config this vit-train does not read ({e}): the file was edited, or "
                f"written by another version"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def lr(self) -> float:
        """The peak learning rate, scaled by data.batch_size / optim.lr_base_batch when that is set."""
        base = self.optim.lr_base_batch
        return self.optim.lr * (self.data.batch_size / base if base else 1.0)

    def sections(self) -> dict[str, Section]:
        """{section name: section} in the schema's order."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), Section)
        }

    def validate(self) -> Config:
        """Fill model.img_size/patch_size left null from the data set, then run every section's checks (one
        ConfigError naming the key for what cannot run); returns self."""
        img_size, patch_size = type(self.data).input_size
        self.model.img_size = img_size if self.model.img_size is None else self.model.img_size
        if self.model.reads_patches:
            self.model.patch_size = patch_size if self.model.patch_size is None else self.model.patch_size
        run: RunConfig = self  # the type checker holds Config to the fields the checks read (schema/sections.py)
        for section in [*self.sections().values(), *self.listed().values()]:
            section.check(run)
        return self

    def listed(self) -> dict[str, Section]:
        """{"logger.NAME" / "callbacks.NAME": the option's section} of the list groups' chosen options."""
        return {f"{group}.{name}": option for group in LIST_GROUPS for name, option in getattr(self, group).items()}


def known_keys() -> list[str]:
    """Every dotted key the schema has, sections included ('model', 'model.embed_dim'); an option section's
    keys are those of all its registered options."""
    keys = []
    for name, tp in field_types(Config).items():
        keys.append(name)
        if name in LIST_GROUPS:  # logger.wandb, logger.wandb.project
            for option, cls in options(name).items():
                keys += [f"{name}.{option}", *(f"{name}.{option}.{k}" for k in section_keys(cls))]
        elif option_base(tp):
            keys += sorted({f"{name}.{k}" for cls in options(tp.group).values() for k in section_keys(cls)})
        elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
            keys += [f"{name}.{k}" for k in section_keys(tp)]
    return keys


def ignored_keys(cfg: Config, named: Iterable[str] = ()) -> list[str]:
    """One warning line per key that `cfg`'s choices ignore (each section's `ignored`) and that was changed
    from its default (the section's class's) or named in `named` (dotted keys from the command line)."""
    named, lines = set(named), []
    for section_name, section in cfg.sections().items():
        default = type(section)()
        for key, choice, users in section.ignored(cfg):
            value = getattr(section, key)
            if f"{section_name}.{key}" in named or value != getattr(default, key):
                lines.append(f"{section_name}.{key}={value} has no effect with {choice}; it applies only to {users}")
    return lines


def override_keys(overrides: Iterable[str]) -> list[str]:
    """The dotted keys that `key=value` command-line overrides set."""
    return [o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o and not o.startswith("-")]


def config_dir() -> str:
    """configs/ inside the installed package (wheel), else at the top of the source checkout."""
    here = Path(__file__).resolve().parent.parent  # vit_train/
    for candidate in (here / "configs", here.parent / "configs"):
        if (candidate / "train.yaml").is_file():
            return str(candidate)
    raise RuntimeError(f"vit-train's configs/ folder is missing (looked in {here} and {here.parent})")


def run_dir_of(resume: str) -> Path:
    """The run directory a checkpoint or resume path belongs to (a run dir, its checkpoints/ or a file in it)."""
    path = Path(resume).expanduser()
    if path.is_file() or (path.suffix == ".pt" and not path.is_dir()):  # a directory named x.pt is a run directory
        path = path.parent
    return path.parent if path.name == "checkpoints" else path


def plain_data(data: Any) -> Any:
    """`data` with every mapping a dict and every other sequence than a string a list (an OmegaConf DictConfig
    or ListConfig reads as one, without importing OmegaConf here)."""
    if isinstance(data, Mapping):
        return {key: plain_data(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(plain_data(value) for value in data)
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        return [plain_data(value) for value in data]
    return data

"""`logger=mlflow`: the run in MLflow, in a local store under the run's directory unless a tracking URI is
given, one MLflow run per vit-train run across resumes, a sweep's jobs nested under one parent run."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from vit_train.trackers.base import Scalar, TrackerStart, import_library, scalars

# results.json's status -> MLflow's RunStatus name
STATUS = {
    "completed": "FINISHED",
    "stopped_early": "FINISHED",
    "interrupted": "KILLED",
    "failed": "FAILED",
    "diverged": "FAILED",
}
LOCAL_STORE = "mlflow.db"  # the default store: a SQLite file in the run's directory
TRUNCATED = "... [truncated: {n} characters]"
GROUP_TAG = "vit_train.group"  # a sweep's jobs and their parent run carry the sweep's name
PARENT_TAG = "vit_train.sweep_parent"  # marks the parent run of a sweep's jobs


KIND_TAG = "mlflow.experimentKind"  # MLflow 3's kind of an experiment (its UI reads it)


@dataclass
class Settings:
    """The keys of `logger.mlflow.*`."""

    tracking_uri: str = ""  # where runs go (http://host:5000, sqlite:///PATH, databricks, ...); "": MLFLOW_TRACKING_URI from the environment, else sqlite:///<run dir>/mlflow.db
    experiment_name: str = "vit-train"  # the MLflow experiment the run goes to (made when missing)


def param_text(value: Scalar) -> str:
    """A flat param as MLflow's text: a str as it is, anything else as JSON ("0.001", "true", "null", "[3, 224, 224]")."""
    return value if isinstance(value, str) else json.dumps(value)


class MlflowTracker:
    """An MLflow run through `MlflowClient` (no global active run: a sweep's jobs in one process stay apart).

    Params: MLflow takes at most 100 per call and values of at most 6000 characters (`MAX_PARAM_VAL_LENGTH`):
    they go in batches, a longer value is cut with a note saying how long it was (the full config is in the run's
    `.hydra/config.yaml`) and the run's tag `vit_train.truncated_params` names the keys cut. A resumed run's
    params are never changed (MLflow refuses): new keys are added, keys with another value named in the tag
    `vit_train.params_changed`.
    """

    name = "mlflow"

    def __init__(self, settings: Settings | None = None):
        self.settings = settings or Settings()
        self.client: Any = None
        self.run_id = ""

    def tracking_uri(self, start: TrackerStart) -> str:
        if self.settings.tracking_uri:
            return self.settings.tracking_uri
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return os.environ["MLFLOW_TRACKING_URI"]
        return f"sqlite:///{(start.run_dir / LOCAL_STORE).resolve()}"

    def start(self, start: TrackerStart) -> str:
        mlflow = import_library("mlflow", "mlflow", self.name)
        uri = self.tracking_uri(start)
        if uri.startswith(
            "sqlite:"
        ):  # MLflow's database store: SQLAlchemy and Alembic, not in mlflow-skinny's own needs
            import_library("sqlalchemy", "mlflow", self.name)
            import_library("alembic", "mlflow", self.name)
        start.run_dir.mkdir(parents=True, exist_ok=True)
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        experiment_id = self.experiment()
        tags = {
            "vit_train.run_id": start.run_id,
            "vit_train.tags": json.dumps(list(start.tags)),
            "vit_train.run_dir": str(start.run_dir.resolve()),
        }
        if start.trial is not None:
            tags["vit_train.trial"] = str(start.trial)
        if start.group:
            tags[GROUP_TAG] = start.group
            tags["mlflow.parentRunId"] = self.parent(experiment_id, start.group)
        if start.tracker_id:
            self.run_id = start.tracker_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            self.run_id = self.client.create_run(experiment_id, run_name=start.display_name).info.run_id
        self.log_params(start.params)
        self.set_tags(tags)
        return str(self.run_id)

    def experiment(self) -> str:
        name = self.settings.experiment_name
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        from mlflow.exceptions import MlflowException

        try:  # a training experiment: MLflow's UI (3.x) then opens it in its model-training view, not GenAI's
            return str(self.client.create_experiment(name, tags={KIND_TAG: "custom_model_development"}))
        except MlflowException:  # a sweep's other job made it first
            return str(self.client.get_experiment_by_name(name).experiment_id)

    def parent(self, experiment_id: str, group: str) -> str:
        """The id of the sweep's parent run (made by the first job; its jobs nest under it in MLflow's UI)."""
        query = f"tags.`{PARENT_TAG}` = '{group}'"
        found = self.client.search_runs([experiment_id], query, order_by=["attributes.start_time ASC"])
        if found:
            return str(found[0].info.run_id)
        made = self.client.create_run(experiment_id, run_name=group, tags={PARENT_TAG: group, GROUP_TAG: group})
        self.client.set_terminated(made.info.run_id, "FINISHED")  # it holds no numbers of its own
        # two jobs starting at once may each make one: all keep the first made, the others' are deleted
        found = self.client.search_runs([experiment_id], query, order_by=["attributes.start_time ASC"])
        first = str(found[0].info.run_id) if found else made.info.run_id
        if first != made.info.run_id:
            self.client.delete_run(made.info.run_id)
        return first

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        limit = max_param_length()
        held = self.client.get_run(self.run_id).data.params
        texts = {key: param_text(value) for key, value in params.items()}
        cut = [key for key, text in texts.items() if len(text) > limit]
        for key in cut:
            note = TRUNCATED.format(n=len(texts[key]))
            texts[key] = texts[key][: limit - len(note)] + note
        changed = sorted(
            k for k in texts if k in held and held[k] != texts[k] and k != "resume"
        )  # resume: each attempt's
        new = [Param(key, text) for key, text in texts.items() if key not in held]
        for first in range(0, len(new), 100):  # MLflow's MAX_PARAMS_TAGS_PER_BATCH
            self.client.log_batch(self.run_id, params=new[first : first + 100])
        if cut:
            self.set_tags({"vit_train.truncated_params": ", ".join(cut)})
        if changed:
            self.set_tags({"vit_train.params_changed": ", ".join(changed)})

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(key, value[:8000]) for key, value in tags.items()]  # MAX_TAG_VAL_LENGTH
        for first in range(0, len(items), 100):
            self.client.log_batch(self.run_id, tags=items[first : first + 100])

    def held(self) -> set[tuple[str, int]]:
        rows = set()
        for key in self.client.get_run(self.run_id).data.metrics:
            if "/" in key:  # a row's "split/name"; results.json's summary metrics have no split
                split = key.split("/", 1)[0]
                rows |= {(split, metric.step) for metric in self.client.get_metric_history(self.run_id, key)}
        return rows

    def log(self, split: str, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(f"{split}/{k}", float(v), now, step) for k, v in values.items() if v is not None]
        self.client.log_batch(self.run_id, metrics=metrics)

    def summary(self, results: dict[str, Any]) -> None:
        """Numbers as metrics named as in results.json (at its `steps`), text and booleans as tags `results.<key>`."""
        from mlflow.entities import Metric

        fields = scalars(results)
        steps = results.get("steps")
        step = steps if isinstance(steps, int) else 0
        now = int(time.time() * 1000)
        numbers = [
            Metric(k, float(v), now, step)
            for k, v in fields.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
        self.client.log_batch(self.run_id, metrics=numbers)
        self.set_tags({f"results.{k}": str(v) for k, v in fields.items() if isinstance(v, (str, bool))})

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, STATUS[status])


def max_param_length() -> int:
    """MLflow's limit on a param's value (6000 characters since MLflow 2.x; 500 before)."""
    try:
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        return int(MAX_PARAM_VAL_LENGTH)
    except ImportError:
        return 500

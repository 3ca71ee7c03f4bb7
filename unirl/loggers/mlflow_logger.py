"""``loggers: [mlflow]``: every row's numbers to MLflow, in a local store by default
(``sqlite:///<run.dir>/mlflow.db``: MLflow 3 keeps its plain-file store in maintenance mode and
refuses it unless ``MLFLOW_ALLOW_FILE_STORE`` is set; a SQLite file is the local store it
recommends), or any tracking URI (``tracking_uri: http://mlflow:5000``). The MLflow run id is kept
in ``<run.dir>/mlflow-run-id``, so a resumed run continues the same MLflow run; rows after the
checkpoint are logged again with their steps (MLflow keeps both values of such a step).

Read back with MLflow's own client: ``MlflowClient(uri).get_metric_history(run_id, key)``."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unirl.loggers import scalars

#: MLflow's run statuses for a run's end status
STATUS = {"completed": "FINISHED", "stopped": "FINISHED", "dry_run": "FINISHED", "interrupted": "KILLED"}


@dataclass
class MlflowLoggerConfig:
    tracking_uri: str = ""  # default: sqlite:///<run.dir>/mlflow.db
    experiment: str = "unirl"
    run_name: str = ""  # default: the run directory's name


class MlflowLogger:
    def __init__(self, config: MlflowLoggerConfig, ctx: Any) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            from unirl.errors import ConfigError

            raise ConfigError(f"loggers: mlflow needs MLflow ({exc}); pip install mlflow-skinny==3.18.0 "
                              f"SQLAlchemy==2.1.9 alembic==1.20.1", key="loggers", value="mlflow") from None
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "Creating initial tables" on stderr
        run_dir = Path(ctx.run_dir)
        self.uri = config.tracking_uri or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        self.client = MlflowClient(self.uri)
        id_file = run_dir / "mlflow-run-id"
        if id_file.exists():
            self.run_id = id_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            found = self.client.get_experiment_by_name(config.experiment)
            experiment = found.experiment_id if found else self.client.create_experiment(config.experiment)
            run = self.client.create_run(experiment, run_name=config.run_name or run_dir.name,
                                         tags={"unirl.run_dir": str(run_dir.resolve()),
                                               "unirl.backend": str(ctx.recipe.backend)})
            self.run_id = run.info.run_id
            id_file.write_text(self.run_id)

    def log(self, row: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in scalars(row).items()])

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=STATUS.get(status, "FAILED"))

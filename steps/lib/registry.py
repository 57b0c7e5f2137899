"""MLflow model registry: register a chosen checkpoint and move `champion` / `fallback`.

Every candidate becomes a model version created from its checkpoint's LoggedModel (source
`models:/<model_id>`, `model_id` set, its run the one that saved it), so the UI shows the
LoggedModel as registered and its lineage one click away; without a LoggedModel (MLflow was
down while training) the version's source is the export. Its tags carry its lineage (source
checkpoint, runs, data, export) and the metric it was selected by. Aliases then move only on evidence: the new version
becomes `champion` when there is none, or when its metric is strictly better than the current
champion's (same metric name, recorded on the champion's version); the displaced champion
becomes `fallback`. A worse (or equal, or incomparable) candidate stays a plain version and
the aliases stay where they are, unless `force`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

from ckptflow.steps.lib.eval_results import better

from ckptflow import env

log = logging.getLogger("ckptflow.registry")
CHAMPION, FALLBACK = "champion", "fallback"
TAG_METRIC = "ckptflow.metric"  # name of the metric the version was selected by
TAG_VALUE = "ckptflow.metric_value"
TAG_MODE = "ckptflow.metric_mode"
TAG_PROMOTED = "ckptflow.promoted"
TAG_MODEL_VERSIONS = "mlflow.modelVersions"  # on a LoggedModel: the versions made from it


@dataclass(frozen=True)
class Decision:
    """What registering one candidate did."""

    version: str  # the new model version
    promoted: bool  # it is the champion now
    champion: str  # champion version after this call
    fallback: str | None  # fallback version after this call
    previous_champion: str | None  # champion before this call
    previous_value: float | None  # its metric (None: no champion, or not comparable)
    reason: str  # why the aliases moved or stayed

    def as_dict(self) -> dict:
        return asdict(self)


def client_for(tracking_uri: str):
    """An MlflowClient whose registry is the tracking store (sqlite, or a tracking server).
    It leaves MLflow's process-wide store alone (see `register`)."""
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def alias_version(client, name: str, alias: str):
    """The model version holding `alias`, or None."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def ensure_model(client, name: str, description: str = "") -> None:
    """Create the registered model unless it exists (another select may create it first)."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
        return
    except MlflowException:
        pass
    try:
        client.create_registered_model(name, description=description or None)
    except MlflowException:
        client.get_registered_model(name)  # created concurrently: fine; otherwise re-raises


def _value(mv, metric: str) -> float | None:
    tags = mv.tags or {}
    if tags.get(TAG_METRIC) != metric:
        return None
    try:
        return float(tags[TAG_VALUE])
    except (KeyError, ValueError):
        return None


def _promotion(
    prev: str | None, prev_value: float | None, value: float, *, metric: str, mode: str, force: bool
) -> tuple[bool, str]:
    """Whether the new version replaces champion `prev` (None: there is none), and why."""
    if prev is None:
        return True, "no champion yet"
    if force:
        return True, f"--force: replaces champion v{prev}"
    if prev_value is None:
        return False, (
            f"champion v{prev} has no recorded {metric}: not comparable, left in place "
            "(use --force to replace it)"
        )
    if better(value, prev_value, mode):
        return True, f"{metric} {value:.6g} beats champion v{prev}'s {prev_value:.6g}"
    return False, (
        f"{metric} {value:.6g} does not beat champion v{prev}'s {prev_value:.6g} ({mode}); "
        "champion left in place (use --force to replace it)"
    )


def _link_logged_model(client, model_id: str, name: str, version: str) -> None:
    """Record the new version on its LoggedModel (`mlflow.modelVersions`, as
    `mlflow.register_model` does): what the UI's "Registered" column and model page read."""
    model = client.get_logged_model(model_id)
    try:
        known = json.loads((model.tags or {}).get(TAG_MODEL_VERSIONS) or "[]")
    except ValueError:
        known = []
    known = [v for v in known if isinstance(v, dict)] + [{"name": name, "version": version}]
    client.set_logged_model_tags(model_id, {TAG_MODEL_VERSIONS: json.dumps(known)})


def register(
    client,
    name: str,
    *,
    source: str,
    run_id: str | None,
    metric: str,
    value: float,
    mode: str,
    tags: dict,
    force: bool = False,
    model_id: str | None = None,
    description: str | None = None,
) -> Decision:
    """Register a new version of `name` and move the aliases (see module doc): from LoggedModel
    `model_id` when given (`source` then only when it is not one), else from `source`."""
    ensure_model(client, name, "ckptflow fine-tuned models, registered from their checkpoints")
    all_tags = {
        **{k: str(v) for k, v in tags.items()},
        TAG_METRIC: metric,
        TAG_VALUE: repr(float(value)),
        TAG_MODE: mode,
    }
    # MLflow's SQL registry looks the LoggedModel up with a default client (the process-wide
    # tracking URI): without it a local store would be searched for in ./mlruns and registering
    # from a LoggedModel would fail; set for this call only, or every later MLflow run of the
    # process would go to this store (env.mlflow_default_store)
    with env.mlflow_default_store(client.tracking_uri):
        mv = client.create_model_version(
            name,
            f"models:/{model_id}" if model_id else source,
            run_id=run_id,
            tags=all_tags,
            description=description,
            model_id=model_id,
        )
    version = str(mv.version)
    if model_id:
        _link_logged_model(client, model_id, name, version)
    champ = alias_version(client, name, CHAMPION)
    prev_fallback = alias_version(client, name, FALLBACK)
    prev = str(champ.version) if champ is not None else None
    prev_value = _value(champ, metric) if champ is not None else None
    promote, reason = _promotion(prev, prev_value, value, metric=metric, mode=mode, force=force)
    fallback = str(prev_fallback.version) if prev_fallback is not None else None
    if promote:
        if prev is not None and prev != version:
            client.set_registered_model_alias(name, FALLBACK, prev)
            fallback = prev
        client.set_registered_model_alias(name, CHAMPION, version)
    client.set_model_version_tag(name, version, TAG_PROMOTED, str(promote).lower())
    log.info("registered %s v%s: %s", name, version, reason)
    return Decision(
        version=version,
        promoted=promote,
        champion=version if promote else str(prev),
        fallback=fallback,
        previous_champion=prev,
        previous_value=prev_value,
        reason=reason,
    )

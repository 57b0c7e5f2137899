"""The manifest fields that hold a bare expression (not a `{{=...}}` tag), evaluated by expr.py:
`outputs.parameters[].valueFrom.expression` of a DAG/steps template and retryStrategy
`expression` (`fromExpression` is in artifacts.py). Each rule cites its Argo source.
"""

from __future__ import annotations

from typing import Any

from ckptflow.workflows.runner.expr import ExprError, evaluate, expand
from ckptflow.workflows.runner.expr_funcs import go_string
from ckptflow.workflows.runner.nodes import Node
from ckptflow.workflows.runner.substitution import to_str

__all__ = ["output_expression", "retry_policy", "retry_continues", "retry_scope"]

RETRY_FALSE = "retryStrategy.expression evaluated to false"


def output_expression(name: str, value_from: dict, scope: dict[str, str]) -> str:
    """An output parameter's `valueFrom.expression` over the template's scope (its inputs and
    its steps'/tasks' outputs): workflow/controller/scope.go resolveParameter, whose error or nil
    result takes `valueFrom.default` when there is one (operator.go getTemplateOutputsFromScope);
    the value is written as Go's `%v` (AnyStringPtr)."""
    try:
        value = evaluate(to_str(value_from["expression"]), expand(scope))
        if value is None:
            raise ExprError("evaluated to nil")
    except ExprError as exc:
        if value_from.get("default") is not None:
            return to_str(value_from["default"])
        raise ValueError(f"output parameter {name!r}: valueFrom.expression: {exc}") from None
    return go_string(value)


def retry_policy(strategy: dict) -> str:
    """The retry policy in force: OnFailure, or Always when an expression decides
    (pkg/apis/workflow/v1alpha1/workflow_types.go RetryPolicyActual)."""
    if strategy.get("retryPolicy"):
        return str(strategy["retryPolicy"])
    return "Always" if strategy.get("expression") else "OnFailure"


def _whole_seconds(last: Node) -> float:
    """A node's duration as the controller reads it: its times are whole seconds (a metav1.Time
    goes through the API as RFC 3339 without fractions, and a pod node's finishedAt is its
    container's termination time, operator.go getLatestFinishedAt), so the difference is too."""
    if last.started_at is None or last.finished_at is None:
        return 0.0
    return float(max(0, int(last.finished_at) - int(last.started_at)))


def retry_scope(attempts: int, last: Node) -> dict[str, Any]:
    """The names a retry expression sees: `retries` and `lastRetry.*` of the last attempt
    (workflow/controller/operator.go buildRetryStrategyLocalScope; all strings, the duration
    in seconds as Go's fmt.Sprint writes a float64 of whole seconds: "3")."""
    return expand(
        {
            "retries": str(attempts - 1),
            "lastRetry.exitCode": "-1" if last.exit_code is None else str(last.exit_code),
            "lastRetry.status": last.phase,
            "lastRetry.duration": go_string(_whole_seconds(last)),
            "lastRetry.message": last.message or "",
        }
    )


def retry_continues(strategy: dict, attempts: int, last: Node) -> bool:
    """Whether retryStrategy `expression` lets another attempt start (operator.go
    processNodeRetries, after the policy and the limit; argoexpr.EvalBool: a result that is
    not a boolean is an error). Raises ExprError."""
    text = strategy.get("expression")
    if not text:
        return True
    result = evaluate(to_str(text), retry_scope(attempts, last))
    if not isinstance(result, bool):
        raise ExprError(f"unable to cast expression result {go_string(result)!r} to bool")
    return result

"""The names Argo puts in every expression's env (util/expr/env/env.go GetFuncMap in
argoproj/argo-workflows): `asInt` and `asFloat` (expr-lang's int and float), `jsonpath`,
`toJson`, and sprig's functions under `sprig` (expr_sprig.py: a subset; Argo deletes `env` and
`expandenv`, which are not here either).
"""

from __future__ import annotations

from typing import Any

from ckptflow.workflows.runner.expr_funcs import as_float, as_int, go_json, jsonpath
from ckptflow.workflows.runner.expr_sprig import SPRIG

__all__ = ["ENV_FUNCS", "SPRIG"]

ENV_FUNCS: dict[str, Any] = {
    "asInt": as_int,
    "asFloat": as_float,
    "jsonpath": jsonpath,
    "toJson": go_json,
    "sprig": SPRIG,
}

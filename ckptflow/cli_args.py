"""Moved to `ckptflow.contract.cli_args` (the workflows' commands use it too); kept importable."""

from ckptflow.contract.cli_args import Parser, join_negative_values, parse, step

__all__ = ["Parser", "join_negative_values", "parse", "step"]

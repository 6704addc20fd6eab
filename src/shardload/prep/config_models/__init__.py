"""The prepare config as typed models: what a YAML file (or dict) may say, checked strictly.

Pydantic v2 models describe the *input* (YAML as written, with its shorthands); ``config.py``
turns a valid input into the frozen :class:`~shardload.prep.config.PrepareConfig` that prepare uses.
Everything here is pure: no file is opened (relative paths are resolved later, in config.py).

Strict types: a quoted ``"false"`` is a string, not a boolean; ``"four"`` is not an integer.
Unknown keys are errors at every level (top, source, view options of every view, execution,
cluster) and each gets a "did you mean" hint. :func:`validate_input` reports every problem at
once, each with its key path (``view.lookbak``, ``execution.cluster.queu``).
"""

from shardload.prep.config_models.execution import (
    CLUSTER_KINDS,
    ExecutionModel,
    execution_shorthand,
)
from shardload.prep.config_models.fields import ConfigValidationError, did_you_mean, parse_size
from shardload.prep.config_models.model import (
    PrepareModel,
    config_schema,
    cross_checks,
    validate_execution,
    validate_input,
)
from shardload.prep.config_models.source import SourceModel, source_shorthand
from shardload.prep.config_models.views import view_shorthand

__all__ = [
    "CLUSTER_KINDS",
    "ConfigValidationError",
    "ExecutionModel",
    "PrepareModel",
    "SourceModel",
    "config_schema",
    "cross_checks",
    "did_you_mean",
    "execution_shorthand",
    "parse_size",
    "source_shorthand",
    "validate_execution",
    "validate_input",
    "view_shorthand",
]

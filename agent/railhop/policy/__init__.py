"""Site policy: the file format (``policies/schema.json``), validation, rails and planning.

    from railhop.policy import load_policy, plan
    policy = load_policy("policies/rail-optimized-8nic.yaml")
    result = plan(topology, health_model.states, policy)

See docs/policy.md for the format and the planning rules shared with the C plugin.
"""

from railhop.policy.model import (
    HealthPolicy,
    Network,
    Policy,
    RailAssign,
    RailMode,
    RailRule,
    Rails,
    RuleKind,
    Spreading,
    Timeouts,
    default_policy,
)
from railhop.policy.plan import BackupPair, Plan, PlanEntry, plan, water_fill
from railhop.policy.rails import RailAssignment, resolve_rails
from railhop.policy.validate import (
    PolicyError,
    PolicyIssue,
    PolicyValidationError,
    check_file,
    check_text,
    load_policy,
    parse_policy,
    schema,
)

__all__ = [
    "BackupPair",
    "HealthPolicy",
    "Network",
    "Plan",
    "PlanEntry",
    "Policy",
    "PolicyError",
    "PolicyIssue",
    "PolicyValidationError",
    "RailAssign",
    "RailAssignment",
    "RailMode",
    "RailRule",
    "Rails",
    "RuleKind",
    "Spreading",
    "Timeouts",
    "check_file",
    "check_text",
    "default_policy",
    "load_policy",
    "parse_policy",
    "plan",
    "resolve_rails",
    "schema",
    "water_fill",
]

//! The policy's shape in state formats 1 and 2, as released: frozen.
//! Those images had no sandbox profiles; their policies convert with none.

use serde::{Deserialize, Serialize};

use super::{Defaulted, Grant, Limits, Policy, Rule};
use crate::daemon::cgroup::PeerCaps;

/// As [`Rule`] without `sandbox`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RuleV2 {
    uids: Vec<u32>,
    gids: Vec<u32>,
    run_as_uids: Vec<u32>,
    run_as_gids: Vec<u32>,
    run_as_any: bool,
    raise_rlimits: bool,
    max_children: Option<usize>,
    memory_max: Option<u64>,
    pids_max: Option<u64>,
    max_connections: Option<usize>,
    max_argv_env_bytes: Option<usize>,
}

/// As [`Policy`] without sandbox profiles.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PolicyV2 {
    connect_any: bool,
    connect_uids: Vec<u32>,
    connect_gids: Vec<u32>,
    limits: Limits,
    rules: Vec<RuleV2>,
    defaulted: Defaulted,
}

/// As [`Grant`], with a [`RuleV2`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GrantV2 {
    rule: RuleV2,
    max_children: usize,
    caps: PeerCaps,
    max_connections: usize,
    max_argv_env_bytes: usize,
}

impl From<RuleV2> for Rule {
    fn from(rule: RuleV2) -> Self {
        Self {
            uids: rule.uids,
            gids: rule.gids,
            run_as_uids: rule.run_as_uids,
            run_as_gids: rule.run_as_gids,
            run_as_any: rule.run_as_any,
            raise_rlimits: rule.raise_rlimits,
            max_children: rule.max_children,
            memory_max: rule.memory_max,
            pids_max: rule.pids_max,
            max_connections: rule.max_connections,
            max_argv_env_bytes: rule.max_argv_env_bytes,
            sandbox: None,
        }
    }
}

impl From<PolicyV2> for Policy {
    fn from(policy: PolicyV2) -> Self {
        Self {
            connect_any: policy.connect_any,
            connect_uids: policy.connect_uids,
            connect_gids: policy.connect_gids,
            limits: policy.limits,
            rules: policy.rules.into_iter().map(Into::into).collect(),
            defaulted: policy.defaulted,
            sandbox: Default::default(),
        }
    }
}

impl From<GrantV2> for Grant {
    fn from(grant: GrantV2) -> Self {
        Self {
            rule: grant.rule.into(),
            max_children: grant.max_children,
            caps: grant.caps,
            max_connections: grant.max_connections,
            max_argv_env_bytes: grant.max_argv_env_bytes,
        }
    }
}

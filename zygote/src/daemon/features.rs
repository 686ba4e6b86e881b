//! The optional features this daemon offers, announced in `HelloAck`, and
//! the refusal of a request that uses one it does not.
//!
//! `ZYGOTE_MASK_FEATURES` (names separated by commas) withholds features
//! the daemon has: it neither announces nor serves them. It exists so that
//! clients can be tested against a daemon that offers fewer features.

use zygote_proto::{Feature, SpawnRequest, SpawnStage};

/// The environment variable naming features to withhold.
pub const MASK_VARIABLE: &str = "ZYGOTE_MASK_FEATURES";

/// The features named in `value` (names separated by commas; unknown names
/// and blanks are ignored).
pub fn parse_mask(value: &str) -> Vec<Feature> {
    value
        .split(',')
        .filter_map(|name| Feature::from_name(name.trim()))
        .collect()
}

/// The features withheld by [`MASK_VARIABLE`] in this process's
/// environment.
pub fn mask_from_env() -> Vec<Feature> {
    std::env::var(MASK_VARIABLE)
        .map(|value| parse_mask(&value))
        .unwrap_or_default()
}

/// The features `request` uses.
pub fn used_by(request: &SpawnRequest) -> impl Iterator<Item = Feature> {
    [
        (request.cgroup.is_some(), Feature::Cgroups),
        (request.pty.is_some(), Feature::Pty),
        (request.large_args.is_some(), Feature::LargeArgs),
        (request.sandbox.is_some(), Feature::Sandbox),
    ]
    .into_iter()
    .filter_map(|(used, feature)| used.then_some(feature))
}

/// The refusal of a request that uses `feature`, which this daemon does
/// not offer: `(stage, errno, message)`.
pub fn refusal(feature: Feature) -> (SpawnStage, i32, String) {
    let stage = match feature {
        Feature::Cgroups => SpawnStage::Cgroup,
        _ => SpawnStage::Validate,
    };
    let message = format!(
        "this zygote does not offer the feature {feature}: its HelloAck lists the features it offers"
    );
    (stage, libc::EOPNOTSUPP, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use zygote_proto::{CgroupSpec, PtySpec, WindowSize};

    #[test]
    fn mask_names_known_features_only() {
        assert_eq!(
            parse_mask("pty, large_args,,teleport"),
            [Feature::Pty, Feature::LargeArgs]
        );
        assert!(parse_mask("").is_empty());
    }

    #[test]
    fn requests_use_the_features_of_their_fields() {
        let plain = SpawnRequest::new(1, "true");
        assert_eq!(used_by(&plain).count(), 0);
        let all = SpawnRequest {
            cgroup: Some(CgroupSpec::default()),
            pty: Some(PtySpec {
                window: WindowSize { rows: 1, cols: 1 },
            }),
            large_args: Some(0),
            ..plain
        };
        let used: Vec<_> = used_by(&all).collect();
        assert_eq!(used, [Feature::Cgroups, Feature::Pty, Feature::LargeArgs]);
        let (stage, errno, message) = refusal(Feature::Pty);
        assert_eq!((stage, errno), (SpawnStage::Validate, libc::EOPNOTSUPP));
        assert!(message.contains("feature pty"), "{message}");
    }
}

//! The bounds of a template's life that the daemon's environment may
//! change, read once at daemon start.

use std::time::Duration;

use super::{
    IDLE_STOP, MAX_AGE, MAX_FORKS, MAX_POOL_SIZE, POOL_ENV, POOL_SIZE, START_DEADLINE,
    START_DEADLINE_ENV,
};

/// `ZYGOTE_TEMPLATE_MAX_FORKS=N`: a template's process is recycled after
/// N forks instead of [`MAX_FORKS`].
pub const MAX_FORKS_ENV: &str = "ZYGOTE_TEMPLATE_MAX_FORKS";

/// `ZYGOTE_TEMPLATE_MAX_AGE_MS=N`: a template's process is recycled after
/// N milliseconds instead of [`MAX_AGE`].
pub const MAX_AGE_ENV: &str = "ZYGOTE_TEMPLATE_MAX_AGE_MS";

/// `ZYGOTE_TEMPLATE_IDLE_MS=N`: a template is stopped after N milliseconds
/// without a spawn instead of [`IDLE_STOP`].
pub const IDLE_ENV: &str = "ZYGOTE_TEMPLATE_IDLE_MS";

/// The longest time any of the millisecond settings may name: 30 days.
pub const MAX_MILLIS: u64 = 30 * 24 * 3600 * 1000;

/// The bounds in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Forks after which a process is recycled.
    pub max_forks: u64,
    /// Age after which a process is recycled.
    pub max_age: Duration,
    /// Time without a spawn after which a template is stopped.
    pub idle_stop: Duration,
    /// How long a template may take to say ready.
    pub start_deadline: Duration,
    /// Children each template keeps forked ahead.
    pub pool_size: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_forks: MAX_FORKS,
            max_age: MAX_AGE,
            idle_stop: IDLE_STOP,
            start_deadline: START_DEADLINE,
            pool_size: POOL_SIZE,
        }
    }
}

impl Settings {
    /// The settings this process's environment asks for.
    ///
    /// # Errors
    ///
    /// A sentence naming the variable and what it accepts, for a value
    /// that is not a whole number in its range.
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// As [`Settings::from_env`], reading variables through `lookup`.
    fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let defaults = Self::default();
        let number = |name: &str, min: u64, max: u64| -> Result<Option<u64>, String> {
            let Some(value) = lookup(name) else {
                return Ok(None);
            };
            match value.trim().parse::<u64>() {
                Ok(parsed) if (min..=max).contains(&parsed) => Ok(Some(parsed)),
                _ => Err(format!(
                    "{name}={value:?} is not a whole number from {min} to {max}"
                )),
            }
        };
        let millis = |name: &str, default: Duration| -> Result<Duration, String> {
            Ok(number(name, 1, MAX_MILLIS)?.map_or(default, Duration::from_millis))
        };
        Ok(Self {
            max_forks: number(MAX_FORKS_ENV, 1, u64::MAX)?.unwrap_or(defaults.max_forks),
            max_age: millis(MAX_AGE_ENV, defaults.max_age)?,
            idle_stop: millis(IDLE_ENV, defaults.idle_stop)?,
            start_deadline: millis(START_DEADLINE_ENV, defaults.start_deadline)?,
            pool_size: number(POOL_ENV, 0, MAX_POOL_SIZE as u64)?
                .map_or(defaults.pool_size, |size| size as usize),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<Settings, String> {
        Settings::from_lookup(|name| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        })
    }

    #[test]
    fn unset_variables_keep_the_defaults() {
        assert_eq!(read(&[]), Ok(Settings::default()));
    }

    #[test]
    fn each_variable_replaces_its_bound() {
        let settings = read(&[
            (MAX_FORKS_ENV, "3"),
            (MAX_AGE_ENV, "1500"),
            (IDLE_ENV, " 2000 "),
            (START_DEADLINE_ENV, "700"),
            (POOL_ENV, "0"),
        ])
        .expect("valid");
        assert_eq!(
            settings,
            Settings {
                max_forks: 3,
                max_age: Duration::from_millis(1500),
                idle_stop: Duration::from_millis(2000),
                start_deadline: Duration::from_millis(700),
                pool_size: 0,
            }
        );
    }

    #[test]
    fn a_bad_value_is_refused_by_name() {
        for (name, bad) in [
            (MAX_FORKS_ENV, "0"),
            (MAX_FORKS_ENV, "many"),
            (MAX_AGE_ENV, "-1"),
            (MAX_AGE_ENV, "0"),
            (IDLE_ENV, "1.5"),
            (IDLE_ENV, ""),
            (START_DEADLINE_ENV, "soon"),
            (POOL_ENV, "9"),
        ] {
            let error = read(&[(name, bad)]).expect_err(bad);
            assert!(error.starts_with(&format!("{name}=")), "{error}");
            assert!(error.contains("not a whole number"), "{error}");
        }
        let too_long = (MAX_MILLIS + 1).to_string();
        assert!(read(&[(IDLE_ENV, &too_long)]).is_err());
        assert!(read(&[(IDLE_ENV, &MAX_MILLIS.to_string())]).is_ok());
    }
}

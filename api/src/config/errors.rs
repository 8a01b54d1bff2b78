//! What is wrong with a configuration: each unusable value with the field it is in, and all of
//! them together, so that one look at a refused configuration shows everything to change (as
//! `kubectl apply` reports every invalid field of a resource, not the first).

use std::fmt;

/// A configuration value that cannot be used, with the field it is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl ConfigError {
    pub fn field(field: &str, message: impl ToString) -> Self {
        ConfigError {
            field: field.into(),
            message: message.to_string(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid configuration: {}: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Every unusable value of a configuration, in the order of the configuration's fields. As an
/// error it is never empty (see [`ConfigErrors::or_ok`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigErrors(Vec<ConfigError>);

impl ConfigErrors {
    pub fn iter(&self) -> std::slice::Iter<'_, ConfigError> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The fields named, in order (a field may be named more than once).
    pub fn fields(&self) -> Vec<&str> {
        self.0.iter().map(|e| e.field.as_str()).collect()
    }

    /// Notes that `field` cannot be used, and why.
    pub(crate) fn push(&mut self, field: &str, message: impl ToString) {
        self.0.push(ConfigError::field(field, message));
    }

    /// The value of a check of `field`, or `None` with its error noted.
    pub(crate) fn check<T, E: ToString>(&mut self, field: &str, result: Result<T, E>) -> Option<T> {
        result.map_err(|e| self.push(field, e)).ok()
    }

    /// The value of a part resolved on its own, or `None` with its errors noted.
    pub(crate) fn absorb<T>(&mut self, result: Result<T, ConfigErrors>) -> Option<T> {
        result.map_err(|e| self.0.extend(e.0)).ok()
    }

    /// `value` if nothing was noted, else these errors.
    pub(crate) fn or_ok<T>(self, value: T) -> Result<T, ConfigErrors> {
        if self.is_empty() {
            Ok(value)
        } else {
            Err(self)
        }
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}

impl IntoIterator for ConfigErrors {
    type Item = ConfigError;
    type IntoIter = std::vec::IntoIter<ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// One error as [`ConfigError`] shows it; several as a list under one heading, one line each.
impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [one] => one.fmt(f),
            all => {
                write!(f, "invalid configuration ({} errors):", all.len())?;
                for e in all {
                    write!(f, "\n* {}: {}", e.field, e.message)?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ConfigErrors {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_error_reads_as_before_and_several_are_listed_one_a_line() {
        let mut errors = ConfigErrors::default();
        errors.push("topology.retention", "must be greater than 0");
        assert_eq!(
            errors.to_string(),
            "invalid configuration: topology.retention: must be greater than 0"
        );
        errors.push("stateDir", "must not be empty");
        assert_eq!(
            errors.to_string(),
            "invalid configuration (2 errors):\n\
             * topology.retention: must be greater than 0\n\
             * stateDir: must not be empty"
        );
    }

    #[test]
    fn checks_keep_the_value_or_note_the_error() {
        let mut errors = ConfigErrors::default();
        assert_eq!(errors.check("a", Ok::<_, String>(1)), Some(1));
        assert_eq!(errors.check::<u8, _>("b", Err("no")), None);
        assert_eq!(
            errors.absorb(Err::<u8, _>(ConfigError::field("c", "no").into())),
            None
        );
        assert_eq!(errors.fields(), ["b", "c"]);
        assert!(errors.or_ok(()).is_err());
        assert_eq!(ConfigErrors::default().or_ok(7), Ok(7));
    }
}

//! The run id, and every name derived from it.
//!
//! A run id is `<model>-<version>-<12 hex digits>`, derived from everything that determines a
//! run's output (DESIGN §4.1). It names the run's journal, its lease directory, its staging
//! directory in each partition, and its Delta application transaction; this type is the one
//! place those names are made and parsed back, and no value that could climb out of a directory
//! is ever one.

use std::fmt;

use deltalake::Path;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where journals live under a table's root.
pub const RUNS_DIR: &str = "_lakefill/runs";

/// Where leases live under a table's root.
pub const LEASES_DIR: &str = "_lakefill/leases";

/// The prefix of a run's staging directory in a partition directory.
/// The directory of a Delta table holding change data files (the protocol's `_change_data`).
pub const CHANGE_DATA_DIR: &str = "_change_data";

const STAGING_PREFIX: &str = "lakefill-";

/// The prefix of a run's Delta application id.
pub const APP_ID_PREFIX: &str = "lakefill:";

/// The longest run id.
const MAX_LEN: usize = 200;

/// A run id: letters, digits, `-`, `_` and `.`, not starting with `.`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RunId(String);

impl RunId {
    /// Reads a run id a user typed (or a file named), refusing anything else.
    pub fn parse(text: &str) -> Result<Self> {
        Self::try_from(text.to_string()).map_err(|message| Error::InvalidOption {
            option: "RUN_ID".into(),
            value: text.to_string(),
            message,
        })
    }

    /// The id of a run of `model@version` whose inputs hash to `digest` (hex).
    pub fn derive(model: &str, version: &str, digest: &str) -> Self {
        let version: String = version
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        Self(format!(
            "{model}-{version}-{}",
            &digest[..digest.len().min(12)]
        ))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The run's journal under the table's root: `_lakefill/runs/<id>.json`.
    pub fn journal_path(&self) -> Path {
        Path::from(format!("{RUNS_DIR}/{}.json", self.0))
    }

    /// The run id a journal file name names, if it names one.
    pub fn from_journal_name(name: &str) -> Option<Self> {
        Self::try_from(name.strip_suffix(".json")?.to_string()).ok()
    }

    /// The run's lease directory under the table's root: `_lakefill/leases/<id>`.
    pub fn lease_dir(&self) -> Path {
        Path::from(format!("{LEASES_DIR}/{}", self.0))
    }

    /// The name of the run's staging directory inside a partition directory: `lakefill-<id>`.
    pub fn staging_dir(&self) -> String {
        format!("{STAGING_PREFIX}{}", self.0)
    }

    /// The directory of the table holding the run's change data files (every partition's, under
    /// it): `_change_data/lakefill-<id>`.
    pub fn change_data_dir(&self) -> String {
        format!("{CHANGE_DATA_DIR}/{}", self.staging_dir())
    }

    /// The run a staging directory name belongs to, if it is one.
    pub fn from_staging_dir(name: &str) -> Option<Self> {
        Self::try_from(name.strip_prefix(STAGING_PREFIX)?.to_string()).ok()
    }

    /// The run's Delta application id: `lakefill:<id>`.
    pub fn app_id(&self) -> String {
        format!("{APP_ID_PREFIX}{}", self.0)
    }
}

impl TryFrom<String> for RunId {
    type Error = String;

    fn try_from(text: String) -> std::result::Result<Self, String> {
        let valid = !text.is_empty()
            && text.len() <= MAX_LEN
            && !text.starts_with('.')
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if valid {
            Ok(Self(text))
        } else {
            Err("a run id holds only letters, digits, `-`, `_` and `.`".into())
        }
    }
}

impl From<RunId> for String {
    fn from(id: RunId) -> Self {
        id.0
    }
}

impl std::ops::Deref for RunId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for RunId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for RunId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for RunId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for RunId {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_could_leave_a_directory_are_refused() {
        for bad in [
            "",
            "../x",
            "a/b",
            ".hidden",
            "a b",
            "a\\b",
            &"x".repeat(201),
        ] {
            assert!(RunId::parse(bad).is_err(), "{bad:?}");
        }
        assert!(RunId::parse("events-v2-0123abcd").is_ok());
        assert!(serde_json::from_str::<RunId>("\"../x\"").is_err());
    }

    #[test]
    fn derived_names_parse_back() {
        let id = RunId::derive("events", "v2.1", "0123456789abcdef");
        assert_eq!(id.as_str(), "events-v2_1-0123456789ab");
        assert_eq!(
            id.journal_path().as_ref(),
            "_lakefill/runs/events-v2_1-0123456789ab.json"
        );
        assert_eq!(
            RunId::from_journal_name("events-v2_1-0123456789ab.json"),
            Some(id.clone())
        );
        assert_eq!(RunId::from_staging_dir(&id.staging_dir()), Some(id.clone()));
        assert_eq!(RunId::from_staging_dir("lakefill-../x"), None);
        assert_eq!(id.app_id(), "lakefill:events-v2_1-0123456789ab");
        assert_eq!(
            id.lease_dir().as_ref(),
            "_lakefill/leases/events-v2_1-0123456789ab"
        );
    }
}

//! Which files the retained versions of a table reference: the guard in front of every delete.
//!
//! A file is referenced when any version whose commit is still in the log (or the snapshot at the
//! oldest retained version, which may rest on a checkpoint) lists it. Paths in the log may be
//! relative (percent-encoded) or absolute; both are kept as absolute locations, encoded and
//! decoded, so a comparison errs on the side of keeping a file. Deleting is left to the callers
//! (`gc`, `run::manage`, the runner); they ask [`ReferencedFiles::contains`]
//! first.

use std::collections::BTreeSet;

use deltalake::DeltaTable;
use url::Url;

use crate::read_commit;
use lakefill_table::config::Project;
use lakefill_table::error::{DeltaContext, Result};
use lakefill_table::storage::{decode, loaded_version, open_table};

/// Absolute locations of every file some retained version of some table references.
#[derive(Debug, Default, Clone)]
pub struct ReferencedFiles {
    locations: BTreeSet<String>,
}

impl ReferencedFiles {
    /// The files of every retained version of `table` (loaded at any version; its latest is read).
    pub async fn of_table(table: &DeltaTable) -> Result<Self> {
        let mut files = Self::default();
        files.add_table(table).await?;
        Ok(files)
    }

    /// The files of every retained version of `table` and of every other table of `project`
    /// (another table may reference files by absolute path, as shallow clones do). Tables that
    /// are not Delta tables yet reference nothing.
    pub async fn of_project(project: &Project, table: &DeltaTable) -> Result<Self> {
        let mut files = Self::of_table(table).await?;
        for config in project.tables() {
            if config.url() == table.table_url() {
                continue;
            }
            match open_table(config, None).await {
                Ok(other) => files.add_table(&other).await?,
                Err(lakefill_table::error::Error::NotADeltaTable { .. }) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(files)
    }

    async fn add_table(&mut self, table: &DeltaTable) -> Result<()> {
        let mut latest = table.clone();
        latest
            .update_incremental(None)
            .await
            .delta_context(|| format!("cannot read the log of `{}`", table.table_url()))?;
        let root = latest.table_url().clone();
        let newest = loaded_version(&latest)?;
        let mut oldest = newest;
        for version in (0..=newest).rev() {
            let Some(commit) = read_commit(&latest, version).await? else {
                break;
            };
            oldest = version;
            for path in &commit.paths {
                self.insert(&root, path);
            }
        }
        // The oldest retained version may rest on a checkpoint: its files are not in any
        // retained commit.
        let mut at_oldest = latest.clone();
        if oldest != newest {
            at_oldest
                .load_version(oldest)
                .await
                .delta_context(|| format!("cannot load version {oldest} of `{root}`"))?;
        }
        let snapshot = at_oldest
            .snapshot()
            .delta_context(|| format!("cannot read the snapshot of `{root}`"))?;
        for file in snapshot.log_data().iter() {
            self.insert_file(&root, &file);
        }
        for file in latest
            .snapshot()
            .delta_context(|| format!("cannot read the snapshot of `{root}`"))?
            .log_data()
            .iter()
        {
            self.insert_file(&root, &file);
        }
        Ok(())
    }

    /// A live file, and the file of its deletion vector, if it has one in a file.
    fn insert_file(&mut self, root: &Url, file: &deltalake::kernel::LogicalFileView) {
        self.insert(root, &file.path());
        if let Some(vector) = file
            .deletion_vector_descriptor()
            .and_then(|d| lakefill_table::vectors::file_of(root, &d))
        {
            self.insert(root, &vector);
        }
    }

    fn insert(&mut self, root: &Url, path: &str) {
        for form in [path.to_string(), decode(path)] {
            self.locations.insert(absolute(root, &form));
        }
    }

    /// Returns whether the object at `path` (relative to `root`, as the object store names it)
    /// may be referenced.
    pub fn contains(&self, root: &Url, path: &str) -> bool {
        let once = decode(path);
        let twice = decode(&once);
        [path, once.as_str(), twice.as_str()]
            .iter()
            .any(|form| self.locations.contains(&absolute(root, form)))
    }
}

/// A log path as an absolute location: absolute URIs as they are, relative paths under `root`.
fn absolute(root: &Url, path: &str) -> String {
    if path.contains("://") {
        return path.trim_end_matches('/').to_string();
    }
    format!(
        "{}/{}",
        root.as_str().trim_end_matches('/'),
        path.trim_start_matches('/')
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_decode() {
        assert_eq!(decode("c=a%2Fb/part.parquet"), "c=a/b/part.parquet");
        assert_eq!(decode("plain/path"), "plain/path");
        assert_eq!(decode("c=50%"), "c=50%");
        assert_eq!(decode("c=%2"), "c=%2");
    }

    #[test]
    fn relative_and_absolute_log_paths_match_objects() {
        let root = Url::parse("s3://bucket/lake/events/").expect("url");
        let mut files = ReferencedFiles::default();
        files.insert(&root, "d=a%2Fb/x.parquet");
        files.insert(&root, "s3://bucket/lake/events/d=1/y.parquet");
        assert!(files.contains(&root, "d=a%2Fb/x.parquet"));
        assert!(files.contains(&root, "d=a%252Fb/x.parquet"));
        assert!(files.contains(&root, "d=1/y.parquet"));
        assert!(!files.contains(&root, "d=1/z.parquet"));
        let other = Url::parse("s3://bucket/lake/other/").expect("url");
        assert!(!files.contains(&other, "d=1/y.parquet"));
    }
}

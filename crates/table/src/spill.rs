//! Where a process's spill files go: `<temp dir>/lakefill-spill/<name>/`, beside `<name>.lock`,
//! which the process holds locked while it lives.
//!
//! Spill files are removed when they are dropped, and DataFusion's own temporary directory when
//! its runtime is; a process killed with `kill -9` (or by the OOM killer) does neither, and a
//! year's validation leaves gigabytes behind. The lock is an advisory file lock, which the
//! kernel releases when its process dies: so the first lakefill process that needs a spill
//! directory removes every directory whose lock nobody holds, and never one whose process still
//! runs. Where the directory cannot be made (a read-only temp dir), DataFusion picks its own, as
//! before.
//!
//! The root is trusted only when it is a real directory of this user: a symbolic link (to
//! anywhere) or a directory another user owns is refused with a warning, never followed nor
//! swept, and DataFusion's own temporary directory is used instead.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use deltalake::datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};

/// The directory of every lakefill process's spill directory, under the system's temp dir
/// (`$TMPDIR`).
fn root() -> PathBuf {
    std::env::temp_dir().join("lakefill-spill")
}

/// This process's spill directory and the lock that says it is in use.
struct SpillDir {
    dir: PathBuf,
    lock_path: PathBuf,
    /// Held for the life of the process.
    _lock: File,
}

static SPILL: OnceLock<Option<SpillDir>> = OnceLock::new();

/// This process's spill directory, made on first use (after removing those of processes that
/// are gone); `None` when it cannot be made.
pub fn dir() -> Option<&'static Path> {
    SPILL
        .get_or_init(|| match create(&root()) {
            Ok(spill) => Some(spill),
            Err(error) if error.kind() == ErrorKind::PermissionDenied => {
                tracing::warn!("{error}; spilling to a temporary directory of DataFusion's");
                None
            }
            Err(error) => {
                tracing::debug!(%error, "no spill directory of lakefill's own; using the system's");
                None
            }
        })
        .as_ref()
        .map(|spill| spill.dir.as_path())
}

/// A disk manager whose spill files go to this process's spill directory (DataFusion's default
/// where there is none).
pub fn disk_manager() -> DiskManagerBuilder {
    match dir() {
        Some(dir) => DiskManagerBuilder::default()
            .with_mode(DiskManagerMode::Directories(vec![dir.to_path_buf()])),
        None => DiskManagerBuilder::default(),
    }
}

/// Removes this process's spill directory, if it made one: called as the process ends, once
/// nothing spills any more.
pub fn release() {
    if let Some(Some(spill)) = SPILL.get() {
        let _ = std::fs::remove_dir_all(&spill.dir);
        let _ = std::fs::remove_file(&spill.lock_path);
    }
}

fn create(root: &Path) -> std::io::Result<SpillDir> {
    std::fs::create_dir_all(root)?;
    let refused = |why: &str| {
        std::io::Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "the spill root `{}` {why}: lakefill neither follows nor sweeps it; remove it, or \
                 point TMPDIR elsewhere",
                root.display()
            ),
        )
    };
    if std::fs::symlink_metadata(root)?.file_type().is_symlink() {
        return Err(refused("is a symbolic link"));
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = format!("{}-{nanos}", std::process::id());
    // Locked before it has its name, so no other process ever sees it unlocked.
    let unnamed = root.join(format!(".{name}.lock.new"));
    let lock = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&unnamed)?;
    // The lock file is this user's: the root must be too (checked before anything is swept).
    if !same_owner(&lock.metadata()?, &std::fs::symlink_metadata(root)?) {
        let _ = std::fs::remove_file(&unnamed);
        return Err(refused("belongs to another user"));
    }
    lock.try_lock().map_err(std::io::Error::other)?;
    sweep(root);
    let lock_path = root.join(format!("{name}.lock"));
    std::fs::rename(&unnamed, &lock_path)?;
    let dir = root.join(&name);
    std::fs::create_dir(&dir)?;
    Ok(SpillDir {
        dir,
        lock_path,
        _lock: lock,
    })
}

#[cfg(unix)]
fn same_owner(mine: &std::fs::Metadata, root: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    mine.uid() == root.uid()
}

#[cfg(not(unix))]
fn same_owner(_: &std::fs::Metadata, _: &std::fs::Metadata) -> bool {
    true
}

/// Removes the spill directories under `root` whose lock no process holds.
fn sweep(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(file_name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        // A lock that never got its name (its process died right after making it): no directory.
        let (name, unnamed) = match file_name.strip_suffix(".lock") {
            Some(name) if !name.starts_with('.') => (name.to_string(), false),
            _ => match file_name
                .strip_prefix('.')
                .and_then(|n| n.strip_suffix(".lock.new"))
            {
                Some(name) => (name.to_string(), true),
                None => continue,
            },
        };
        let Ok(lock) = OpenOptions::new().write(true).open(&path) else {
            continue;
        };
        if lock.try_lock().is_err() {
            // Its process is alive (or another process is removing it right now).
            continue;
        }
        if !unnamed {
            let dir = root.join(&name);
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => tracing::info!(
                    dir = %dir.display(),
                    "removed the spill files of a lakefill process that did not finish"
                ),
                Err(error) if error.kind() == ErrorKind::NotFound => {}
                // The lock stays, so that a later process tries again.
                Err(_) => continue,
            }
        }
        let _ = std::fs::remove_file(&path);
    }
}

//! One process per run id at a time: a lease next to the run's journal (DESIGN §4).
//!
//! A lease is a small object `_lakefill/leases/<run_id>/<generation>.json` under the target's
//! root. Taking it means creating the next generation with a conditional put (put-if-absent), so
//! of two processes racing for a run exactly one wins, on local disk and on S3 alike. The holder
//! renews its generation in the background; a lease is free when it was released, when its holder
//! is a process on this machine that no longer runs, or when it was not renewed for its
//! time-to-live (a holder on another machine that crashed). A newer generation always wins: a
//! holder that finds one has lost the lease and must stop writing.
//!
//! Who may write what is left to the callers: [`crate::journal::Journal::save`] takes the lease
//! of its run, so a process never rewrites the journal of a run it does not hold.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use deltalake::logstore::object_store::{ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use deltalake::{ObjectStore, ObjectStoreError, Path};
use serde::{Deserialize, Serialize};

use lakefill_table::error::{Error, Result};
use lakefill_table::run_id::RunId;

/// How long a lease stays valid without renewal.
const DEFAULT_TTL: Duration = Duration::from_secs(120);

/// What a lease object holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LeaseRecord {
    run_id: RunId,
    generation: u64,
    holder: Holder,
    /// What the holder is doing, e.g. `backfill`.
    command: String,
    acquired_at: String,
    renewed_at: String,
    ttl_seconds: u64,
    #[serde(default)]
    released: bool,
}

/// The process holding a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Holder {
    host: String,
    /// Linux boot id: two processes with the same boot id run on the same machine, so the holder's
    /// liveness can be checked directly instead of waiting for the time-to-live.
    boot_id: Option<String>,
    pid: u32,
    /// Start time of the process (clock ticks after boot), so a reused pid is not mistaken for it.
    started: Option<u64>,
    /// The PID namespace `pid` is a number of (`pid:[4026531836]`): containers on one machine
    /// share its boot id, but not their pids. A holder of another namespace (or of a version
    /// that did not record one) is judged by the time-to-live only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pid_namespace: Option<String>,
}

impl Holder {
    fn current() -> Self {
        let pid = std::process::id();
        Self {
            host: read_trimmed("/proc/sys/kernel/hostname").unwrap_or_else(|| "unknown".into()),
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
            pid,
            started: process_start(pid),
            pid_namespace: pid_namespace(),
        }
    }

    /// `Some(alive)` when the holder runs on this machine and its liveness can be read; `None`
    /// when only the time-to-live can tell.
    fn alive_here(&self) -> Option<bool> {
        let here = read_trimmed("/proc/sys/kernel/random/boot_id")?;
        if self.boot_id.as_deref() != Some(here.as_str()) {
            return None;
        }
        let namespace = pid_namespace()?;
        if self.pid_namespace.as_deref() != Some(namespace.as_str()) {
            return None;
        }
        Some(process_start(self.pid).is_some_and(|started| Some(started) == self.started))
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// This process's PID namespace, as `/proc/self/ns/pid` links to it.
fn pid_namespace() -> Option<String> {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|target| target.to_str().map(str::to_string))
}

/// Field 22 of `/proc/<pid>/stat`: when the process started; `None` when there is no such
/// process, or it has ended (a zombie, `Z`, or dead, `X`, in field 3): a process killed whose
/// parent has not waited for it yet no longer runs, and holds nothing.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after the last `)`.
    let mut after = stat[stat.rfind(')')? + 1..].split_whitespace();
    if matches!(after.next(), Some("Z" | "X" | "x")) {
        return None;
    }
    after.nth(18)?.parse().ok()
}

fn now_millis() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn lease_path(run_id: &RunId, generation: u64) -> Path {
    run_id
        .lease_dir()
        .join(format!("{generation:020}.json").as_str())
}

/// Who holds a run, as `lakefill runs` and refusals describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    /// The holder, e.g. `` `backfill` by pid 4242 on host-a``.
    pub description: String,
    /// When it took the lease (RFC 3339).
    pub since: String,
    /// When the lease expires unless renewed (RFC 3339).
    pub expires: String,
}

/// A held lease on one run. Renewed in the background until [`RunLease::release`].
#[derive(Debug)]
pub struct RunLease {
    run_id: RunId,
    generation: u64,
    store: Arc<dyn ObjectStore>,
    record: LeaseRecord,
    ttl: Duration,
    state: Arc<LeaseState>,
    renewal: Option<tokio::task::JoinHandle<()>>,
}

#[derive(Debug)]
struct LeaseState {
    lost: AtomicBool,
    /// When the lease was last written, in milliseconds since the epoch.
    renewed_at: AtomicI64,
}

impl RunLease {
    /// Takes the lease of `run_id` in `store`, or fails with [`Error::RunBusy`] when another
    /// live process holds it.
    pub async fn acquire(
        store: &Arc<dyn ObjectStore>,
        table: &str,
        run_id: &RunId,
        command: &str,
    ) -> Result<Self> {
        Self::acquire_with_ttl(store, table, run_id, command, DEFAULT_TTL).await
    }

    /// [`RunLease::acquire`] with a time-to-live of `ttl`.
    pub async fn acquire_with_ttl(
        store: &Arc<dyn ObjectStore>,
        table: &str,
        run_id: &RunId,
        command: &str,
        ttl: Duration,
    ) -> Result<Self> {
        // A lost race to create a generation means someone else just took it: look again, a few
        // times, in case they released it meanwhile.
        for _ in 0..5 {
            let latest = latest_generation(store, run_id).await?;
            let next = match &latest {
                None => 1,
                Some((generation, record)) => {
                    if let Some(holder) = record.as_ref().and_then(live_holder) {
                        return Err(Error::RunBusy {
                            run_id: run_id.to_string(),
                            holder: holder.description,
                            since: holder.since,
                            expires: holder.expires,
                        });
                    }
                    generation + 1
                }
            };
            let now = lakefill_table::time::now();
            let record = LeaseRecord {
                run_id: run_id.clone(),
                generation: next,
                holder: Holder::current(),
                command: command.to_string(),
                acquired_at: now.clone(),
                renewed_at: now,
                ttl_seconds: ttl.as_secs().max(1),
                released: false,
            };
            let path = lease_path(run_id, next);
            let payload = PutPayload::from(serde_json::to_vec(&record).map_err(|e| {
                Error::Internal(format!("cannot serialize the lease of `{run_id}`: {e}"))
            })?);
            match store
                .put_opts(&path, payload, PutOptions::from(PutMode::Create))
                .await
            {
                Ok(_) => {
                    let mut lease = Self {
                        run_id: run_id.clone(),
                        generation: next,
                        store: Arc::clone(store),
                        record,
                        ttl,
                        state: Arc::new(LeaseState {
                            lost: AtomicBool::new(false),
                            renewed_at: AtomicI64::new(now_millis()),
                        }),
                        renewal: None,
                    };
                    lease.start_renewal();
                    // Older generations are history: only the newest counts.
                    if let Some((older, _)) = latest {
                        for generation in 1..=older {
                            let _ = store.delete(&lease_path(run_id, generation)).await;
                        }
                    }
                    tracing::debug!(%run_id, generation = next, "took the run's lease");
                    return Ok(lease);
                }
                Err(
                    ObjectStoreError::AlreadyExists { .. } | ObjectStoreError::Precondition { .. },
                ) => {
                    continue;
                }
                Err(ObjectStoreError::NotImplemented { .. }) => {
                    return Err(Error::UnsafeStore {
                        table: table.to_string(),
                        reason: "conditional writes are disabled (`aws_conditional_put`), so two processes could work on one run and overwrite each other's commits".into(),
                    });
                }
                Err(source) => {
                    return Err(Error::Storage {
                        path: path.to_string(),
                        source,
                    });
                }
            }
        }
        Err(Error::RunBusy {
            run_id: run_id.to_string(),
            holder: "another process".into(),
            since: lakefill_table::time::now(),
            expires: "when it finishes".into(),
        })
    }

    /// Renews the lease every quarter of its time-to-live, and notices when a newer generation
    /// took over (then the lease is lost for good).
    fn start_renewal(&mut self) {
        let store = Arc::clone(&self.store);
        let state = Arc::clone(&self.state);
        let mut record = self.record.clone();
        let interval = (self.ttl / 4).max(Duration::from_millis(50));
        self.renewal = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                match latest_generation(&store, &record.run_id).await {
                    Ok(Some((generation, _))) if generation > record.generation => {
                        state.lost.store(true, Ordering::SeqCst);
                        tracing::warn!(run_id = %record.run_id, "another process took over the run");
                        return;
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::debug!(run_id = %record.run_id, %error, "cannot check the lease");
                        continue;
                    }
                }
                record.renewed_at = lakefill_table::time::now();
                let Ok(bytes) = serde_json::to_vec(&record) else {
                    continue;
                };
                let path = lease_path(&record.run_id, record.generation);
                match store.put(&path, PutPayload::from(bytes)).await {
                    Ok(_) => state.renewed_at.store(now_millis(), Ordering::SeqCst),
                    Err(error) => {
                        tracing::debug!(run_id = %record.run_id, %error, "cannot renew the lease")
                    }
                }
            }
        }));
    }

    /// The generation this lease is (see [`still_held`]).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Returns the run id the lease is for.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// Fails when the lease can no longer be trusted: a newer generation took over, or renewals
    /// have failed for so long that another process may have taken it.
    pub fn check(&self) -> Result<()> {
        let stale = now_millis() - self.state.renewed_at.load(Ordering::SeqCst)
            > i64::try_from(self.ttl.as_millis() * 3 / 4).unwrap_or(i64::MAX);
        if self.state.lost.load(Ordering::SeqCst) || stale {
            return Err(Error::LeaseLost {
                run_id: self.run_id.to_string(),
            });
        }
        Ok(())
    }

    /// Gives the lease up, so that the next process need not wait. Best effort: a lease that
    /// cannot be released expires.
    pub async fn release(mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        if self.state.lost.load(Ordering::SeqCst) {
            return;
        }
        let mut record = self.record.clone();
        record.released = true;
        record.renewed_at = lakefill_table::time::now();
        if let Ok(bytes) = serde_json::to_vec(&record)
            && let Err(error) = self
                .store
                .put(
                    &lease_path(&self.run_id, self.generation),
                    PutPayload::from(bytes),
                )
                .await
        {
            tracing::debug!(run_id = %self.run_id, %error, "cannot release the lease; it will expire");
        }
        // Released: Drop has nothing left to do.
        self.state.lost.store(true, Ordering::SeqCst);
    }
}

impl Drop for RunLease {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        if self.state.lost.load(Ordering::SeqCst) {
            return;
        }
        // Dropped without release (an early return or a panic): release in the background if a
        // runtime is still there; otherwise the holder's exit or the time-to-live frees it.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let store = Arc::clone(&self.store);
            let mut record = self.record.clone();
            record.released = true;
            let path = lease_path(&self.run_id, self.generation);
            handle.spawn(async move {
                if let Ok(bytes) = serde_json::to_vec(&record) {
                    let _ = store.put(&path, PutPayload::from(bytes)).await;
                }
            });
        }
    }
}

/// The holder of a lease record, if it still holds it.
fn live_holder(record: &LeaseRecord) -> Option<LeaseHolder> {
    if record.released {
        return None;
    }
    let renewed = chrono::DateTime::parse_from_rfc3339(&record.renewed_at)
        .map(|t| t.timestamp_millis())
        .unwrap_or(0);
    let ttl_ms = i64::try_from(record.ttl_seconds.saturating_mul(1000)).unwrap_or(i64::MAX);
    let alive = match record.holder.alive_here() {
        Some(alive) => alive,
        None => now_millis() - renewed <= ttl_ms,
    };
    alive.then(|| LeaseHolder {
        description: format!(
            "`{}` by pid {} on {}",
            record.command, record.holder.pid, record.holder.host
        ),
        since: record.acquired_at.clone(),
        expires: chrono::DateTime::from_timestamp_millis(renewed.saturating_add(ttl_ms))
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_default(),
    })
}

/// Who holds the lease of `run_id` now, if anyone.
pub async fn holder(store: &Arc<dyn ObjectStore>, run_id: &RunId) -> Result<Option<LeaseHolder>> {
    Ok(latest_generation(store, run_id)
        .await?
        .and_then(|(_, record)| record)
        .as_ref()
        .and_then(live_holder))
}

/// Whether generation `generation` of the lease of `run_id` may still be held, for a process
/// that writes on the holder's behalf (a cluster's writer task): false once a newer generation
/// exists (another process took the run over), once the holder released it (it stopped: Ctrl-C,
/// a failure), or once it was not renewed for its time-to-live (the holder died). The holder's
/// process is not looked up, even on this machine (a writer may run in another process
/// namespace). What cannot be read counts as held: the check only stops writers, and the
/// holder's own commit checks stay what protects the table.
pub async fn still_held(store: &Arc<dyn ObjectStore>, run_id: &RunId, generation: u64) -> bool {
    let latest = match latest_generation(store, run_id).await {
        Ok(latest) => latest,
        Err(error) => {
            tracing::warn!(%run_id, %error, "cannot read the run's lease; assuming it is held");
            return true;
        }
    };
    match latest {
        Some((latest, _)) if latest > generation => false,
        Some((latest, Some(record))) if latest == generation => {
            let renewed = chrono::DateTime::parse_from_rfc3339(&record.renewed_at)
                .map(|t| t.timestamp_millis())
                .unwrap_or(i64::MAX);
            let ttl_ms = i64::try_from(record.ttl_seconds.saturating_mul(1000)).unwrap_or(i64::MAX);
            !record.released && now_millis().saturating_sub(renewed) <= ttl_ms
        }
        _ => true,
    }
}

/// The newest generation of a run's lease and its record (`None` when it cannot be read: a
/// lease object being written, or damaged; it counts as free).
async fn latest_generation(
    store: &Arc<dyn ObjectStore>,
    run_id: &RunId,
) -> Result<Option<(u64, Option<LeaseRecord>)>> {
    let dir = run_id.lease_dir();
    let objects = lakefill_table::storage::list_objects(store, &dir).await?;
    let Some(latest) = objects
        .iter()
        .filter_map(|o| {
            o.location
                .filename()
                .and_then(|name| name.strip_suffix(".json"))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .max()
    else {
        return Ok(None);
    };
    let record = match store.get(&lease_path(run_id, latest)).await {
        Ok(result) => match result.bytes().await {
            Ok(bytes) => serde_json::from_slice::<LeaseRecord>(&bytes).ok(),
            Err(_) => None,
        },
        Err(_) => None,
    };
    Ok(Some((latest, record)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(text: &str) -> RunId {
        RunId::parse(text).expect("run id")
    }

    fn run_x() -> RunId {
        id("run-x")
    }
    use deltalake::logstore::object_store::memory::InMemory;

    fn store() -> Arc<dyn ObjectStore> {
        Arc::new(InMemory::new())
    }

    #[tokio::test]
    async fn a_held_lease_refuses_a_second_holder_until_released() {
        let store = store();
        let first = RunLease::acquire(&store, "t", &id("run-a"), "backfill")
            .await
            .expect("free");
        let err = RunLease::acquire(&store, "t", &id("run-a"), "publish")
            .await
            .expect_err("held");
        assert!(matches!(err, Error::RunBusy { .. }), "{err}");
        assert_eq!(err.exit_code(), 4);
        // Another run is independent.
        RunLease::acquire(&store, "t", &id("run-b"), "backfill")
            .await
            .expect("other run")
            .release()
            .await;
        first.release().await;
        let second = RunLease::acquire(&store, "t", &id("run-a"), "publish")
            .await
            .expect("released");
        assert_eq!(second.generation, 2);
        second.check().expect("held");
        second.release().await;
    }

    #[tokio::test]
    async fn a_writer_for_a_holder_sees_when_its_generation_is_no_longer_held() {
        let store = store();
        let run = id("run-w");
        // Nobody took it yet: nothing says the writer must stop.
        assert!(still_held(&store, &run, 1).await);
        let first = RunLease::acquire(&store, "t", &run, "backfill")
            .await
            .expect("free");
        assert!(still_held(&store, &run, first.generation()).await);
        first.release().await;
        assert!(!still_held(&store, &run, 1).await, "released");
        let second = RunLease::acquire(&store, "t", &run, "backfill")
            .await
            .expect("free again");
        assert!(!still_held(&store, &run, 1).await, "taken over");
        assert!(still_held(&store, &run, 2).await);
        // A holder that stopped renewing (killed) is gone once its time-to-live passed.
        let mut record = second.record.clone();
        record.renewed_at = (chrono::Utc::now() - chrono::Duration::seconds(5)).to_rfc3339();
        record.ttl_seconds = 1;
        drop(second);
        tokio::time::sleep(Duration::from_millis(50)).await;
        store
            .put(
                &lease_path(&run, 2),
                PutPayload::from(serde_json::to_vec(&record).expect("json")),
            )
            .await
            .expect("put");
        assert!(!still_held(&store, &run, 2).await, "expired");
    }

    /// A holder in another PID namespace of this machine (a container: same boot id) is judged
    /// by the time-to-live: its pid means another process here (pid 1 is this namespace's init).
    #[test]
    fn a_holder_of_another_pid_namespace_is_judged_by_the_ttl() {
        let here = Holder::current();
        if here.boot_id.is_none() || here.pid_namespace.is_none() {
            return; // Not Linux: liveness is always by time-to-live.
        }
        let record = |holder: Holder, renewed: chrono::DateTime<chrono::Utc>| LeaseRecord {
            run_id: run_x(),
            generation: 1,
            holder,
            command: "backfill".into(),
            acquired_at: renewed.to_rfc3339(),
            renewed_at: renewed.to_rfc3339(),
            ttl_seconds: 120,
            released: false,
        };
        let now = chrono::Utc::now();
        let long_ago = now - chrono::Duration::seconds(600);
        let in_container = Holder {
            pid: 1,
            started: Some(7),
            pid_namespace: Some("pid:[1]".into()),
            ..here.clone()
        };
        assert!(live_holder(&record(in_container.clone(), now)).is_some());
        assert!(live_holder(&record(in_container, long_ago)).is_none());
        // Recorded by a version that did not name its namespace: the same.
        let unnamed = Holder {
            pid: 1,
            started: Some(7),
            pid_namespace: None,
            ..here.clone()
        };
        assert!(live_holder(&record(unnamed, now)).is_some());
        // In this namespace the process itself decides, whatever the time-to-live says.
        assert!(live_holder(&record(here.clone(), long_ago)).is_some());
        let dead = Holder {
            started: here.started.map(|s| s + 1),
            ..here
        };
        assert!(live_holder(&record(dead, now)).is_none());
    }

    #[tokio::test]
    async fn racing_processes_get_one_lease() {
        let store = store();
        let attempts = (0..8).map(|_| {
            let store = Arc::clone(&store);
            tokio::spawn(
                async move { RunLease::acquire(&store, "t", &id("run-r"), "backfill").await },
            )
        });
        let mut won = Vec::new();
        for attempt in attempts {
            if let Ok(lease) = attempt.await.expect("task") {
                won.push(lease);
            }
        }
        assert_eq!(won.len(), 1, "exactly one winner");
    }

    #[tokio::test]
    async fn a_dead_holder_on_another_machine_expires_and_the_taker_wins() {
        let store = store();
        // A holder on another machine that stopped renewing a second ago, with a 1 s ttl.
        let record = LeaseRecord {
            run_id: run_x(),
            generation: 1,
            holder: Holder {
                host: "elsewhere".into(),
                boot_id: Some("another-machine".into()),
                pid: 1,
                started: None,
                pid_namespace: None,
            },
            command: "backfill".into(),
            acquired_at: "2026-01-01T00:00:00Z".into(),
            renewed_at: (chrono::Utc::now() - chrono::Duration::seconds(5)).to_rfc3339(),
            ttl_seconds: 1,
            released: false,
        };
        store
            .put(
                &lease_path(&run_x(), 1),
                PutPayload::from(serde_json::to_vec(&record).expect("json")),
            )
            .await
            .expect("put");
        let lease = RunLease::acquire(&store, "t", &run_x(), "backfill")
            .await
            .expect("expired lease is free");
        assert_eq!(lease.generation, 2);
        lease.release().await;
    }

    #[tokio::test]
    async fn a_holder_that_is_overtaken_knows_it_lost() {
        let store = store();
        let lease = RunLease::acquire_with_ttl(
            &store,
            "t",
            &id("run-l"),
            "backfill",
            Duration::from_millis(400),
        )
        .await
        .expect("free");
        // Someone decided the lease expired and took generation 2.
        let mut record = lease.record.clone();
        record.generation = 2;
        store
            .put(
                &lease_path(&id("run-l"), 2),
                PutPayload::from(serde_json::to_vec(&record).expect("json")),
            )
            .await
            .expect("put");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let err = lease.check().expect_err("lost");
        assert!(matches!(err, Error::LeaseLost { .. }), "{err}");
    }

    #[test]
    fn this_process_is_alive_and_a_made_up_one_is_not() {
        let me = Holder::current();
        if me.boot_id.is_some() {
            assert_eq!(me.alive_here(), Some(true));
            let ghost = Holder {
                started: me.started.map(|s| s + 1),
                ..me
            };
            assert_eq!(ghost.alive_here(), Some(false));
        }
    }

    /// A process killed and not yet waited for (a zombie) holds nothing: the next command need
    /// not wait for its lease to expire.
    #[test]
    fn a_killed_process_not_yet_waited_for_is_not_alive() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        let started = process_start(pid);
        assert!(started.is_some(), "a running child has a start time");
        let holder = Holder {
            pid,
            started,
            ..Holder::current()
        };
        if holder.boot_id.is_some() {
            assert_eq!(holder.alive_here(), Some(true));
        }
        child.kill().expect("kill");
        // Not waited for: a zombie until `wait`, once the kernel has ended it.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while process_start(pid).is_some() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("a zombie");
        assert!(state.contains(") Z "), "{state}");
        assert_eq!(process_start(pid), None);
        if holder.boot_id.is_some() {
            assert_eq!(holder.alive_here(), Some(false));
        }
        child.wait().expect("wait");
    }
}

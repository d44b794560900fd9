//! The keys whose rows the key merge found changed, and how, kept for the change data feed.
//!
//! The merge pairs every row of the differing partitions by key already: it knows which keys
//! are new, which are gone, and which came back with other rows. The feed needs exactly that
//! (which rows are `insert`, `delete`, `update_preimage` and `update_postimage`), so a run that
//! writes one records it here while validating, and the feed then reads each side once, keeping
//! the rows of the keys recorded, instead of grouping both sides by key again and joining them
//! with the result ([`crate::feed`]).
//!
//! A key is known by the 96 bits the merge keeps of its hash ([`super::Entry`]). What is
//! recorded is held in memory, 16 bytes a changed key, reserved from the session's memory pool
//! and within a budget; beyond it (or when the pool refuses) the record is given up and the feed
//! finds the keys itself, as before. Hand-written: the lookup is a sorted array with a directory
//! by the top bits of the hash, a fifth of the memory of a hash map of the same keys, and one
//! cache miss a lookup.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use deltalake::datafusion::execution::memory_pool::{
    MemoryConsumer, MemoryPool, MemoryReservation,
};

/// How a key's rows changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum KeyChange {
    /// Only the new side has rows of the key.
    Insert,
    /// Only the old side has rows of the key.
    Delete,
    /// Both sides have rows of the key, and they differ (as multisets of rows).
    Update,
}

/// The rows of one side of one compared partition, by how their key changed (a row of a key
/// whose rows came back the same is counted in `rows` only). With them, the feed can tell a
/// partition whose every row is of one change: its files are copied into change data files
/// whole, not read and written again row by row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SideRows {
    /// Every row the merge read of the side and partition.
    pub rows: u64,
    /// Rows of keys only the new side has.
    pub insert: u64,
    /// Rows of keys only the old side has.
    pub delete: u64,
    /// Rows of keys whose rows differ.
    pub update: u64,
}

impl SideRows {
    /// The change every row has, when there are rows and all have one.
    pub fn whole(&self) -> Option<KeyChange> {
        [
            (self.insert, KeyChange::Insert),
            (self.delete, KeyChange::Delete),
            (self.update, KeyChange::Update),
        ]
        .into_iter()
        .find(|(rows, _)| self.rows > 0 && *rows == self.rows)
        .map(|(_, change)| change)
    }

    /// Counts `rows` more rows of `change` (`None`: of an unchanged key).
    pub(crate) fn add(&mut self, change: Option<KeyChange>, rows: u64) {
        self.rows += rows;
        match change {
            Some(KeyChange::Insert) => self.insert += rows,
            Some(KeyChange::Delete) => self.delete += rows,
            Some(KeyChange::Update) => self.update += rows,
            None => {}
        }
    }

    fn merge(&mut self, other: &SideRows) {
        self.rows += other.rows;
        self.insert += other.insert;
        self.delete += other.delete;
        self.update += other.update;
    }
}

/// The old side's and the new side's [`SideRows`] of one partition.
pub type PartitionRows = [SideRows; 2];

/// What a run's key merge records of the keys it found changed, for the change data feed to
/// use once the merge finished ([`Self::found`]).
pub struct KeyChanges {
    pool: Arc<dyn MemoryPool>,
    max_bytes: usize,
    state: Mutex<State>,
}

impl std::fmt::Debug for KeyChanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyChanges")
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
enum State {
    /// No merge started, or what it recorded was given up.
    #[default]
    Nothing,
    /// A merge is recording.
    Recording(Recorded),
    /// The merge finished: every changed key is here.
    Found(Arc<FoundChanges>),
}

struct Recorded {
    labels: Option<BTreeSet<String>>,
    keys: Vec<(u64, u32, KeyChange)>,
    rows: BTreeMap<String, PartitionRows>,
    null_keys: bool,
    reservation: MemoryReservation,
}

/// The bytes a recorded key takes.
const KEY_BYTES: usize = std::mem::size_of::<(u64, u32, KeyChange)>();

impl KeyChanges {
    /// A record of at most `max_bytes` of keys, reserved from `pool`.
    pub fn new(pool: &Arc<dyn MemoryPool>, max_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            pool: Arc::clone(pool),
            max_bytes,
            state: Mutex::new(State::Nothing),
        })
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut state)
    }

    /// A merge of the partitions `labels` (all without them) starts recording; what an earlier
    /// one recorded is dropped.
    pub(crate) fn start(&self, labels: Option<BTreeSet<String>>) {
        let reservation = MemoryConsumer::new("change feed: the keys the comparison found changed")
            .register(&self.pool);
        self.with_state(|state| {
            *state = State::Recording(Recorded {
                labels,
                keys: Vec::new(),
                rows: BTreeMap::new(),
                null_keys: false,
                reservation,
            })
        });
    }

    /// Whether a merge is recording.
    pub(crate) fn recording(&self) -> bool {
        self.with_state(|state| matches!(state, State::Recording(_)))
    }

    /// Adds changed keys (first half of the key hash, 32 bits of the second); gives the record
    /// up when they pass the budget or the pool refuses them.
    pub(crate) fn add(&self, keys: Vec<(u64, u32, KeyChange)>) {
        if keys.is_empty() {
            return;
        }
        self.with_state(|state| {
            let State::Recording(recorded) = state else {
                return;
            };
            let bytes = keys.len() * KEY_BYTES;
            let within = recorded.reservation.size() + bytes <= self.max_bytes
                && recorded.reservation.try_grow(bytes).is_ok();
            if within {
                recorded.keys.extend(keys);
            } else {
                tracing::debug!(
                    max_bytes = self.max_bytes,
                    "too many changed keys to keep for the change feed: it finds them itself"
                );
                *state = State::Nothing;
            }
        });
    }

    /// Adds the rows of compared partitions, by label, old side first.
    pub(crate) fn add_rows(&self, rows: impl IntoIterator<Item = (String, PartitionRows)>) {
        self.with_state(|state| {
            let State::Recording(recorded) = state else {
                return;
            };
            for (label, [old, new]) in rows {
                let sides = recorded.rows.entry(label).or_default();
                sides[0].merge(&old);
                sides[1].merge(&new);
            }
        });
    }

    /// Notes that the differing partitions have rows with a NULL key column (which no key
    /// holds: the feed compares them whole).
    pub(crate) fn null_keys(&self) {
        self.with_state(|state| {
            if let State::Recording(recorded) = state {
                recorded.null_keys = true;
            }
        });
    }

    /// Drops what is recorded: the merge cannot tell every changed key.
    pub(crate) fn give_up(&self) {
        self.with_state(|state| *state = State::Nothing);
    }

    /// The merge finished: what it recorded is every changed key.
    pub(crate) fn finish(&self) {
        self.with_state(|state| {
            if let State::Recording(recorded) = std::mem::take(state) {
                *state = State::Found(Arc::new(FoundChanges::of(recorded)));
            }
        });
    }

    /// Every key the finished merge found changed, if it recorded them all.
    pub fn found(&self) -> Option<Arc<FoundChanges>> {
        self.with_state(|state| match state {
            State::Found(found) => Some(Arc::clone(found)),
            _ => None,
        })
    }
}

/// The keys a merge found changed, and how: looked up by the halves of a key hash
/// ([`lakefill_table::rowhash::key_hash_sql`]).
pub struct FoundChanges {
    /// The partitions the merge compared (all of them: `None`); the rows of the others are the
    /// same on both sides.
    labels: Option<BTreeSet<String>>,
    /// Sorted by key hash.
    keys: Vec<(u64, u32, KeyChange)>,
    /// The rows of each compared partition, by side and change.
    rows: BTreeMap<String, PartitionRows>,
    /// Per value of the top [`DIRECTORY_BITS`] bits of the first half: where its keys start.
    directory: Vec<u32>,
    /// The bits of the directory: 0 (one slot) for few keys.
    bits: u32,
    null_keys: bool,
    _reservation: MemoryReservation,
}

impl std::fmt::Debug for FoundChanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FoundChanges")
            .field("keys", &self.keys.len())
            .field("null_keys", &self.null_keys)
            .finish_non_exhaustive()
    }
}

/// Where the changed keys of one first half of a key hash start ([`FoundChanges::first_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirstOf(usize);

/// Bits of a key hash's first half that index the directory of [`FoundChanges`]: about a key
/// per slot at a million keys, 4 MiB.
const DIRECTORY_BITS: u32 = 20;

impl FoundChanges {
    fn of(recorded: Recorded) -> Self {
        let Recorded {
            labels,
            mut keys,
            rows,
            null_keys,
            reservation,
        } = recorded;
        // The buckets come in order of the top bits already; a bucket's keys in order.
        if !keys.is_sorted_by_key(|k| (k.0, k.1)) {
            keys.sort_unstable_by_key(|k| (k.0, k.1));
        }
        let bits = if keys.len() < 1 << 12 {
            0
        } else {
            DIRECTORY_BITS
        };
        let slot = |k1: u64| {
            if bits == 0 {
                0
            } else {
                (k1 >> (64 - bits)) as usize
            }
        };
        let mut directory = vec![0u32; (1 << bits) + 1];
        for key in &keys {
            directory[slot(key.0) + 1] += 1;
        }
        for i in 1..directory.len() {
            directory[i] += directory[i - 1];
        }
        let _ = reservation.try_grow(directory.len() * 4);
        Self {
            labels,
            keys,
            rows,
            directory,
            bits,
            null_keys,
            _reservation: reservation,
        }
    }

    /// How the key of these hash halves changed (`None`: it did not, or is not known).
    pub fn change(&self, k1: u64, k2: u64) -> Option<KeyChange> {
        self.first_of(k1).and_then(|at| self.change_at(at, k1, k2))
    }

    /// Where the changed keys whose first half is `k1` start, if any has it: when none does,
    /// the key did not change, and its second half need not be computed to look it up
    /// ([`Self::change_at`] then finds it without searching again).
    pub fn first_of(&self, k1: u64) -> Option<FirstOf> {
        let slot = match self.bits {
            0 => 0,
            bits => (k1 >> (64 - bits)) as usize,
        };
        let from = self.directory[slot] as usize;
        let keys = &self.keys[from..self.directory[slot + 1] as usize];
        let at = keys.partition_point(|k| k.0 < k1);
        keys.get(at)
            .filter(|k| k.0 == k1)
            .map(|_| FirstOf(from + at))
    }

    /// How the key of these hash halves changed, its first half's keys starting at `at`
    /// ([`Self::first_of`] of `k1`).
    pub fn change_at(&self, at: FirstOf, k1: u64, k2: u64) -> Option<KeyChange> {
        self.keys[at.0..]
            .iter()
            .take_while(|k| k.0 == k1)
            .find(|k| k.1 == k2 as u32)
            .map(|k| k.2)
    }

    /// The partitions the merge compared (`None`: all of them).
    pub fn labels(&self) -> Option<&BTreeSet<String>> {
        self.labels.as_ref()
    }

    /// The rows the merge read of partition `label`, old side first, by change; `None` when it
    /// read none.
    pub fn partition_rows(&self, label: &str) -> Option<PartitionRows> {
        self.rows.get(label).copied()
    }

    /// The partitions the merge read rows of (of those it compared), in order.
    pub fn read_labels(&self) -> impl Iterator<Item = &String> {
        self.rows.keys()
    }

    /// Whether the compared partitions have rows with a NULL key column.
    pub fn null_keys(&self) -> bool {
        self.null_keys
    }

    /// How many keys changed.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key changed.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The rows of every compared partition the merge read, by label.
    #[cfg(test)]
    pub(crate) fn every_partition_rows(&self) -> &BTreeMap<String, PartitionRows> {
        &self.rows
    }

    /// Every changed key, by its hash halves, with how it changed.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> &[(u64, u32, KeyChange)] {
        &self.keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::datafusion::execution::memory_pool::{GreedyMemoryPool, UnboundedMemoryPool};

    #[test]
    fn keys_are_found_by_both_halves_whatever_their_number_and_budget() {
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        for count in [0u64, 1, 5, 4095, 4096, 50_000] {
            let changes = KeyChanges::new(&pool, usize::MAX);
            changes.start(None);
            // Spread over the whole range of the first half, two buckets' worth in turn.
            let key = |i: u64| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15), (i % 7) as u32);
            let kinds = [KeyChange::Insert, KeyChange::Delete, KeyChange::Update];
            let all: Vec<_> = (0..count)
                .map(|i| (key(i).0, key(i).1, kinds[(i % 3) as usize]))
                .collect();
            for chunk in all.chunks(1000) {
                changes.add(chunk.to_vec());
            }
            assert!(changes.found().is_none(), "not before the merge finished");
            changes.finish();
            let found = changes.found().expect("found");
            assert_eq!(found.len() as u64, count);
            for (i, (k1, k2, kind)) in all.iter().enumerate() {
                assert_eq!(found.change(*k1, u64::from(*k2)), Some(*kind), "key {i}");
                let first = found.first_of(*k1).expect("first half recorded");
                assert_eq!(found.change_at(first, *k1, u64::from(*k2)), Some(*kind));
                // The same first half with another second half is another key.
                assert_eq!(found.change(*k1, u64::from(*k2) + 100), None);
                assert_eq!(found.change(k1 ^ 1, u64::from(*k2)), None);
                assert_eq!(found.first_of(k1 ^ 1), None, "key {i}");
            }
        }
        // Past the budget, or what the pool grants, the record is given up.
        let changes = KeyChanges::new(&pool, 10 * KEY_BYTES);
        changes.start(None);
        changes.add(vec![(1, 1, KeyChange::Insert); 11]);
        changes.finish();
        assert!(changes.found().is_none());
        let small: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(5 * KEY_BYTES));
        let changes = KeyChanges::new(&small, usize::MAX);
        changes.start(None);
        changes.add(vec![(1, 1, KeyChange::Insert); 6]);
        changes.finish();
        assert!(changes.found().is_none());
        // A merge that gave up finds nothing; a new start records again.
        changes.start(Some(BTreeSet::from(["2026-01-01".to_string()])));
        changes.add(vec![(1, 1, KeyChange::Delete)]);
        changes.give_up();
        changes.finish();
        assert!(changes.found().is_none());
    }
}

//! Keys that cross the edges of the range (#32): the check that a partial fix neither loses nor
//! duplicates rows at the partitions just outside it.
//!
//! A fix that moves rows between partitions (a time zone corrected, a late-arrival rule changed)
//! moves some of them across the edges of a range that does not cover the whole table. The
//! partitions outside are not replaced, so two things go wrong silently:
//!
//! - **duplicated**: a key the fix writes into the range that the target still holds in a
//!   partition outside it (the old copy stays, the new one is added);
//! - **moved**: a key the fix removes from the range that the model writes into a partition
//!   outside it (the row vanishes: that partition is not replaced).
//!
//! The run gathers, in the partitions around the range, the keys of the target at the read
//! version and the keys the model produces there (computed, never written): an [`EdgeProbe`].
//! The key merge ([`super::keymerge`]) looks up every key it finds added to or removed from the
//! range in the probe, so the check costs one hash lookup per added or removed row and the
//! reads of the partitions around the range, never a second pass over the range.
//! [`EdgeFindings`] counts what crosses each edge, and [`closure`] widens the range until no key
//! crosses: the range that would be clean.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};

use lakefill_table::time::{Grain, Period};

/// The name of the check in reports.
pub const EDGE_CHECK: &str = "edges";

/// The name of the check of keys that cross the edge of a `--where` predicate.
pub const SCOPE_EDGE_CHECK: &str = "where_edges";

/// A key as the merge knows it: the first half of its hash and 32 bits of the second.
pub type KeyHash = (u64, u32);

/// The keys seen, by key: a map whose hasher does little (the keys are hashes already).
pub type KeyMap = deltalake::datafusion::common::HashMap<KeyHash, Sightings>;

/// Where one key was seen: the periods holding it in the target at the read version (`old`) and
/// the periods the model writes it into (`new`). Inside the range, only what the key merge
/// reported (a key added to or removed from the range) is known.
#[derive(Debug, Clone, Default)]
pub struct Sightings {
    /// Where the target holds the key at the read version.
    pub old: Places,
    /// Where the model writes it.
    pub new: Places,
}

/// The periods a key was seen in on one side: almost always one, kept without an allocation.
#[derive(Debug, Clone, Default)]
pub enum Places {
    #[default]
    /// Not seen.
    None,
    /// In one period.
    One(Period),
    /// In several periods.
    Many(Vec<Period>),
}

impl Places {
    fn add(&mut self, period: Period) {
        match self {
            Places::None => *self = Places::One(period),
            Places::One(one) if *one == period => {}
            Places::One(one) => *self = Places::Many(vec![*one, period]),
            Places::Many(many) => {
                if !many.contains(&period) {
                    many.push(period);
                }
            }
        }
    }

    /// The periods, in the order they were seen.
    pub fn iter(&self) -> impl Iterator<Item = &Period> {
        let slice: &[Period] = match self {
            Places::None => &[],
            Places::One(one) => std::slice::from_ref(one),
            Places::Many(many) => many,
        };
        slice.iter()
    }
}

impl Sightings {
    fn add(&mut self, new: bool, period: Period) {
        if new {
            self.new.add(period);
        } else {
            self.old.add(period);
        }
    }

    fn periods(&self) -> impl Iterator<Item = &Period> {
        self.old.iter().chain(self.new.iter())
    }
}

/// A key the merge found added to (or removed from) the range that the probe holds.
#[derive(Debug, Clone)]
pub struct Hit {
    /// The key's hash.
    pub key: KeyHash,
    /// Added to the range (else removed from it).
    pub added: bool,
    /// The partition of the range, as the merge labels it.
    pub label: String,
}

/// The keys of the partitions around the range, for the key merge to look up, and what it found.
pub struct EdgeProbe {
    keys: KeyMap,
    hits: Mutex<Vec<Hit>>,
    consulted: AtomicBool,
}

impl std::fmt::Debug for EdgeProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeProbe")
            .field("keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl EdgeProbe {
    /// A probe over the keys seen around the range.
    pub fn new(keys: KeyMap) -> Self {
        Self {
            keys,
            hits: Mutex::new(Vec::new()),
            consulted: AtomicBool::new(false),
        }
    }

    /// Whether the key was seen around the range.
    pub fn contains(&self, k1: u64, k2: u32) -> bool {
        self.keys.contains_key(&(k1, k2))
    }

    /// Records keys the merge found added to or removed from the range that the probe holds.
    pub fn record(&self, hits: impl IntoIterator<Item = Hit>) {
        if let Ok(mut all) = self.hits.lock() {
            all.extend(hits);
        }
    }

    /// Notes that a merge paired the sides with this probe (every added and removed key of the
    /// range was looked up).
    pub fn consulted(&self) {
        self.consulted.store(true, Ordering::Relaxed);
    }

    /// Whether a merge looked up every added and removed key of the range.
    pub fn was_consulted(&self) -> bool {
        self.consulted.load(Ordering::Relaxed)
    }

    /// Whether no key was seen around the range (nothing can cross).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The keys seen around the range, with what the merge found of them inside it, and the
    /// keys it found (the only ones that can cross an edge of the range).
    pub fn into_sightings(self, grain: Grain) -> (KeyMap, Vec<KeyHash>) {
        let mut keys = self.keys;
        let hits = self.hits.into_inner().unwrap_or_default();
        let mut found = Vec::with_capacity(hits.len());
        // The hits name a few partitions: each label is parsed once, not once a hit.
        let mut periods: std::collections::HashMap<String, Option<Period>> =
            std::collections::HashMap::new();
        for hit in hits {
            let Some(sightings) = keys.get_mut(&hit.key) else {
                continue;
            };
            let period = match periods.get(&hit.label) {
                Some(period) => *period,
                None => {
                    let period = Period::from_label(grain, &hit.label);
                    periods.insert(hit.label, period);
                    period
                }
            };
            if let Some(period) = period {
                sightings.add(hit.added, period);
                found.push(hit.key);
            }
        }
        found.sort_unstable();
        found.dedup();
        (keys, found)
    }
}

/// Adds the keys of `rows` (seen on the `new` side or the old one) to `keys`.
pub fn add_sightings(
    keys: &mut KeyMap,
    new: bool,
    rows: impl IntoIterator<Item = (KeyHash, Period)>,
) {
    for (key, period) in rows {
        keys.entry(key).or_default().add(new, period);
    }
}

/// What crosses the edges of the range `from..=to`, per partition outside it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EdgeFindings {
    /// Keys the fix writes into the range that the target still holds outside it: per outside
    /// partition, the keys and the partitions of the range they are written into.
    pub duplicated: BTreeMap<Period, (u64, BTreeSet<Period>)>,
    /// Keys the fix removes from the range that the model writes outside it: per outside
    /// partition, the keys and the partitions of the range they leave.
    pub moved: BTreeMap<Period, (u64, BTreeSet<Period>)>,
}

impl EdgeFindings {
    /// What crosses the edges of `from..=to`, from the keys seen around it and inside it: of
    /// the keys `candidates` (those seen inside it; a key seen only outside crosses nothing).
    pub fn of<'a>(
        keys: &KeyMap,
        candidates: impl IntoIterator<Item = &'a KeyHash>,
        from: Period,
        to: Period,
    ) -> Self {
        let inside = |p: &Period| from <= *p && *p <= to;
        let mut findings = Self::default();
        for sightings in candidates.into_iter().filter_map(|k| keys.get(k)) {
            let (old_in, old_out): (Vec<Period>, Vec<Period>) =
                sightings.old.iter().partition(|p| inside(p));
            let (new_in, new_out): (Vec<Period>, Vec<Period>) =
                sightings.new.iter().partition(|p| inside(p));
            // Written into the range, not there before, still outside: a second copy.
            if !new_in.is_empty()
                && old_in.is_empty()
                && let Some(outside) = old_out.first()
            {
                let entry = findings.duplicated.entry(*outside).or_default();
                entry.0 += 1;
                entry.1.extend(new_in.iter().copied());
            }
            // Gone from the range, written outside by the model: lost with the range.
            if !old_in.is_empty()
                && new_in.is_empty()
                && let Some(outside) = new_out.first()
            {
                let entry = findings.moved.entry(*outside).or_default();
                entry.0 += 1;
                entry.1.extend(old_in.iter().copied());
            }
        }
        findings
    }

    /// Whether no key crosses an edge.
    pub fn is_clean(&self) -> bool {
        self.duplicated.is_empty() && self.moved.is_empty()
    }

    /// The check's failures: one line per outside partition and kind.
    pub fn failures(&self) -> Vec<Value> {
        let list = |periods: &BTreeSet<Period>| {
            let mut labels: Vec<String> = periods.iter().take(3).map(Period::label).collect();
            if periods.len() > 3 {
                labels.push(format!("… {} partitions", periods.len()));
            }
            labels.join(", ")
        };
        let mut out = Vec::new();
        for (outside, (keys, inside)) in &self.duplicated {
            out.push(json!({
                "duplicated": keys,
                "outside": outside.label(),
                "inside": list(inside),
                "message": format!(
                    "{keys} keys the fix writes into {} are still in {}, outside the range: they would be there twice",
                    list(inside), outside.label()
                ),
            }));
        }
        for (outside, (keys, inside)) in &self.moved {
            out.push(json!({
                "moved": keys,
                "outside": outside.label(),
                "inside": list(inside),
                "message": format!(
                    "{keys} keys the fix removes from {} belong in {} by the model, outside the range: they would vanish",
                    list(inside), outside.label()
                ),
            }));
        }
        out
    }
}

/// The smallest range holding `from..=to` across whose edges no key of `keys` crosses: a key
/// seen in a partition of the range must have every partition it is seen in inside it. Only
/// the partitions `keys` were gathered over count; the caller makes sure they reach far enough.
pub fn closure(keys: &KeyMap, from: Period, to: Period) -> (Period, Period) {
    let (mut low, mut high) = (from, to);
    loop {
        let (mut next_low, mut next_high) = (low, high);
        for sightings in keys.values() {
            if sightings.periods().any(|p| low <= *p && *p <= high) {
                for period in sightings.periods() {
                    next_low = next_low.min(*period);
                    next_high = next_high.max(*period);
                }
            }
        }
        if (next_low, next_high) == (low, high) {
            return (low, high);
        }
        (low, high) = (next_low, next_high);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(n: i64) -> Period {
        Period::from_label(Grain::Day, "2024-01-10")
            .and_then(|p| p.offset(n))
            .expect("a day")
    }

    /// Keys of a one-day time zone shift over days -3..=3: key `i` sits in day `d` in the old
    /// table and in day `d + 1` in the new one, for every day.
    fn shifted(days: std::ops::RangeInclusive<i64>) -> KeyMap {
        let mut keys = KeyMap::default();
        for d in days {
            add_sightings(&mut keys, false, [((d as u64, 0), day(d))]);
            add_sightings(&mut keys, true, [((d as u64, 0), day(d + 1))]);
        }
        keys
    }

    #[test]
    fn a_shift_duplicates_at_one_edge_and_loses_at_the_other() {
        let keys = shifted(-3..=3);
        let findings = EdgeFindings::of(&keys, keys.keys(), day(-1), day(1));
        // Key -2 sits in day -2 (outside) and is written into day -1: twice.
        assert_eq!(findings.duplicated.len(), 1);
        let (count, inside) = &findings.duplicated[&day(-2)];
        assert_eq!(
            (*count, inside.iter().copied().collect::<Vec<_>>()),
            (1, vec![day(-1)])
        );
        // Key 1 leaves day 1 for day 2 (outside): lost.
        let (count, inside) = &findings.moved[&day(2)];
        assert_eq!(
            (*count, inside.iter().copied().collect::<Vec<_>>()),
            (1, vec![day(1)])
        );
        // Keys moving inside the range, and keys outside it, do not cross.
        assert!(EdgeFindings::of(&keys, keys.keys(), day(-10), day(10)).is_clean());
    }

    #[test]
    fn the_closure_of_a_shift_is_everything_seen() {
        let keys = shifted(-3..=3);
        assert_eq!(closure(&keys, day(0), day(0)), (day(-3), day(4)));
    }

    #[test]
    fn the_closure_stops_where_no_key_crosses() {
        // Keys move from day 0 to day 1 only; day 5 has keys of its own that stay.
        let mut keys = KeyMap::default();
        add_sightings(&mut keys, false, [((1, 1), day(0)), ((2, 2), day(5))]);
        add_sightings(&mut keys, true, [((1, 1), day(1)), ((2, 2), day(5))]);
        assert_eq!(closure(&keys, day(-2), day(0)), (day(-2), day(1)));
        assert!(EdgeFindings::of(&keys, keys.keys(), day(-2), day(1)).is_clean());
        // A key outside on both sides (old before the range, new after it) does not cross.
        let mut keys = KeyMap::default();
        add_sightings(&mut keys, false, [((3, 3), day(-1))]);
        add_sightings(&mut keys, true, [((3, 3), day(2))]);
        assert_eq!(closure(&keys, day(0), day(1)), (day(0), day(1)));
        assert!(EdgeFindings::of(&keys, keys.keys(), day(0), day(1)).is_clean());
    }

    #[test]
    fn hits_place_keys_inside_the_range() {
        let mut keys = KeyMap::default();
        add_sightings(&mut keys, false, [((7, 7), day(-1))]);
        add_sightings(&mut keys, true, [((8, 8), day(2))]);
        let probe = EdgeProbe::new(keys);
        assert!(probe.contains(7, 7) && !probe.contains(7, 8));
        probe.record([
            Hit {
                key: (7, 7),
                added: true,
                label: day(0).label(),
            },
            Hit {
                key: (8, 8),
                added: false,
                label: day(1).label(),
            },
        ]);
        let (keys, found) = probe.into_sightings(Grain::Day);
        assert_eq!(found.len(), 2);
        let findings = EdgeFindings::of(&keys, &found, day(0), day(1));
        assert_eq!((findings.duplicated.len(), findings.moved.len()), (1, 1));
        assert_eq!(findings.failures().len(), 2);
    }
}

//! Append-only targets (issue #17): a fix published as adjustment rows. The ledger and its
//! source are written by python `deltalake` (the ledger with `delta.appendOnly = true`), every
//! result is read back by python, and the expectations are computed here from the rows the
//! helper writes, never from lakefill's output.

use std::collections::{BTreeMap, BTreeSet};

use lakefill::{CrashPhase, CrashPoint};
use serde_json::Value;

use crate::support::{PythonLake, Store, json_ok, runtime, stderr};

/// A row: (event_id, country, amount_cents, event_date).
type Row = (i64, String, i64, String);

const COUNTRIES: [&str; 4] = ["FR", "US", "DE", "JP"];

/// A project with `events` (the source) and `ledger` (append-only), both holding the same rows,
/// and model `fix` publishing as adjustments.
fn ledger(store: Store) -> PythonLake {
    let mut lake = PythonLake::new(store);
    lake.python(&["ledger", "plain", &lake.uri("events")]);
    lake.python(&["ledger", "append_only", &lake.uri("ledger")]);
    lake.declare("events");
    lake.declare("ledger");
    // Consumers are told of every version (top-level keys come before the tables).
    let project = lake.path().join("lakefill.toml");
    let toml = std::fs::read_to_string(&project).unwrap();
    std::fs::write(
        &project,
        format!("notify = [\"file:events.jsonl\"]\n{toml}"),
    )
    .unwrap();
    write_fix(&lake, "v1", 5);
    lake
}

/// The newest event the file sink holds, checked against the committed JSON Schema.
fn newest_event(lake: &PythonLake) -> Value {
    let text = std::fs::read_to_string(lake.path().join("events.jsonl")).unwrap();
    let line = text.lines().last().unwrap();
    crate::notify::assert_valid_event(line);
    serde_json::from_str(line).unwrap()
}

/// `fix` at `version`: even events gain `bump` cents, event 101 moves to the next day, event 103
/// is dropped, and event 999 appears on the first day.
fn write_fix(lake: &PythonLake, version: &str, bump: i64) {
    lake.model_version(
        "fix",
        version,
        "target = \"ledger\"\npartition_by = \"event_date\"\nschema = \"add-columns\"\n\
         publish = \"adjustments\"\nreason = \"refunds were counted twice\"\n\
         [sources.events]\nwindow = \"event_date\"\n\
         [validate]\nkey = [\"event_id\"]\nmeasures = [\"amount_cents\"]",
        &format!(
            "SELECT event_id, country, \
             CASE WHEN event_id % 2 = 0 THEN amount_cents + {bump} ELSE amount_cents END AS amount_cents, \
             CASE WHEN event_id = 101 THEN DATE '2026-01-02' ELSE event_date END AS event_date \
             FROM events WHERE event_date BETWEEN $start AND $end AND event_id <> 103 \
             UNION ALL SELECT CAST(999 AS BIGINT), 'XX', CAST(7 AS BIGINT), DATE '2026-01-01'"
        ),
    );
}

/// The rows python writes (3 days x 4 events).
fn original() -> BTreeSet<Row> {
    let mut rows = BTreeSet::new();
    for d in 0..3 {
        for i in 0..4 {
            rows.insert((
                100 * (d + 1) + i,
                COUNTRIES[i as usize].to_string(),
                1000 + 10 * d + i,
                format!("2026-01-0{}", d + 1),
            ));
        }
    }
    rows
}

/// The rows history should hold after the fix with `bump` over days 1..=2.
fn fixed(bump: i64) -> BTreeSet<Row> {
    let mut rows = BTreeSet::new();
    for (id, country, amount, date) in original() {
        if date.as_str() > "2026-01-02" {
            rows.insert((id, country, amount, date));
            continue;
        }
        if id == 103 {
            continue;
        }
        let amount = if id % 2 == 0 { amount + bump } else { amount };
        let date = if id == 101 { "2026-01-02".into() } else { date };
        rows.insert((id, country, amount, date));
    }
    rows.insert((999, "XX".into(), 7, "2026-01-01".into()));
    rows
}

/// The net rows of a ledger read by python: rows that are the same but for the amount and the
/// lineage summed, kept while they outnumber their reversals.
fn net(rows: &[Value]) -> BTreeSet<Row> {
    netted(rows, |amount: &mut i64, row| {
        *amount += row["amount_cents"].as_i64().unwrap();
    })
    .into_iter()
    .map(|((id, country, date), amount)| (id, country, amount, date))
    .collect()
}

/// Per (event_id, country, event_date), the measures `add` sums over the group's rows, for the
/// groups with more rows than reversals.
fn netted<T: Default>(
    rows: &[Value],
    add: impl Fn(&mut T, &Value),
) -> BTreeMap<(i64, String, String), T> {
    let mut groups: BTreeMap<(i64, String, String), (i64, T)> = BTreeMap::new();
    for row in rows {
        let entry = groups
            .entry((
                row["event_id"].as_i64().unwrap(),
                row["country"].as_str().unwrap().to_string(),
                row["event_date"].as_str().unwrap().to_string(),
            ))
            .or_default();
        entry.0 += if row["_lakefill_kind"] == "reversal" {
            -1
        } else {
            1
        };
        add(&mut entry.1, row);
    }
    groups
        .into_iter()
        .filter(|(_, (weight, _))| *weight > 0)
        .map(|(group, (_, sums))| (group, sums))
        .collect()
}

/// The amount per key over every row (old rows plus adjustments).
fn sums(rows: &[Value]) -> BTreeMap<i64, i64> {
    let mut sums = BTreeMap::new();
    for row in rows {
        *sums.entry(row["event_id"].as_i64().unwrap()).or_default() +=
            row["amount_cents"].as_i64().unwrap();
    }
    sums
}

/// The adjustment rows that take `old` to `new`: (kind, row), the reversals negated.
fn adjustments(old: &BTreeSet<Row>, new: &BTreeSet<Row>) -> BTreeSet<(String, Row)> {
    let reversals = old
        .difference(new)
        .map(|(id, c, amount, d)| ("reversal".to_string(), (*id, c.clone(), -amount, d.clone())));
    let corrections = new
        .difference(old)
        .map(|row| ("correction".to_string(), row.clone()));
    reversals.chain(corrections).collect()
}

/// The `remove` actions and the mode of commit `version` of `ledger`, from the log.
fn commit_shape(lake: &PythonLake, version: u64) -> (usize, String) {
    commit_shape_of(lake, "ledger", version)
}

/// The `remove` actions and the mode of commit `version` of `table`, from the log.
fn commit_shape_of(lake: &PythonLake, table: &str, version: u64) -> (usize, String) {
    let table = lake.open(table);
    runtime().block_on(async {
        let bytes = table
            .log_store()
            .read_commit_entry(version)
            .await
            .unwrap()
            .unwrap();
        let actions: Vec<Value> = bytes
            .split(|b| *b == b'\n')
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect();
        let removes = actions.iter().filter(|a| a.get("remove").is_some()).count();
        let mode = actions
            .iter()
            .find_map(|a| a["commitInfo"]["operationParameters"]["mode"].as_str())
            .unwrap_or_default()
            .to_string();
        (removes, mode)
    })
}

fn backfill(lake: &PythonLake, extra: &[&str]) -> Value {
    json_ok(&backfill_output(lake, extra))
}

/// `backfill fix` of the first two days, JSON, with `extra` arguments: what it printed and its
/// exit code.
fn backfill_output(lake: &PythonLake, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "backfill",
        "fix",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
        "--output-format",
        "json",
    ];
    args.extend_from_slice(extra);
    lake.run(&args)
}

/// A fix of an append-only ledger is published as appended adjustment rows whose sum with the
/// old rows is the fixed history; a reader of just the appended files gets exactly them; the
/// same run again appends nothing; a second fix nets against the first; a revert appends the
/// negation.
fn a_fix_of_an_append_only_ledger_is_appended_as_adjustments(store: Store) {
    let lake = ledger(store);
    let version = |lake: &PythonLake| lake.open("ledger").version().unwrap();
    let start = version(&lake);

    // A rewrite would remove files: refused at plan time, with the way out.
    let out = lake.run(&[
        "plan",
        "fix",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
        "--publish-as",
        "rewrite",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("appendOnly"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--publish-as adjustments"),
        "{}",
        stderr(&out)
    );

    let report = backfill(&lake, &[]);
    assert_eq!(report["outcome"], "published", "{report}");
    let first = version(&lake);
    assert_eq!(first, start + 1, "one commit");
    let expected = adjustments(&original(), &fixed(5));
    let reversals = expected.iter().filter(|(k, _)| k == "reversal").count();
    assert_eq!(report["adjustments"]["reversals"], reversals, "{report}");
    assert_eq!(
        report["adjustments"]["corrections"],
        expected.len() - reversals,
        "{report}"
    );
    assert_eq!(
        commit_shape(&lake, first),
        (0, "Append".into()),
        "nothing removed"
    );
    let event = newest_event(&lake);
    assert_eq!(event["type"], "backfill.published", "{event}");
    assert_eq!(event["adjustments"], report["adjustments"], "{event}");
    let config = lake
        .open("ledger")
        .snapshot()
        .unwrap()
        .metadata()
        .configuration()
        .clone();
    assert_eq!(
        config.get("delta.appendOnly").map(String::as_str),
        Some("true"),
        "the protocol is kept"
    );
    let rows = lake.rows("ledger");
    assert_eq!(
        net(&rows),
        fixed(5),
        "old rows plus adjustments are the fixed history"
    );
    let expected_sums: BTreeMap<i64, i64> =
        fixed(5)
            .iter()
            .fold(BTreeMap::new(), |mut acc, (id, _, amount, _)| {
                *acc.entry(*id).or_default() += amount;
                acc
            });
    let mut got = sums(&rows);
    got.retain(|_, sum| *sum != 0);
    assert_eq!(got, expected_sums, "SUM per key");

    // A reader of only the appended files gets exactly the adjustments, with their lineage.
    let appended: Value =
        serde_json::from_str(&lake.python(&["added", &lake.uri("ledger"), &first.to_string()]))
            .unwrap();
    let run_id = report["run_id"].as_str().unwrap();
    let read: BTreeSet<(String, Row)> = appended["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["_lakefill_run_id"], run_id, "{r}");
            assert_eq!(r["_lakefill_reason"], "refunds were counted twice", "{r}");
            (
                r["_lakefill_kind"].as_str().unwrap().to_string(),
                (
                    r["event_id"].as_i64().unwrap(),
                    r["country"].as_str().unwrap().to_string(),
                    r["amount_cents"].as_i64().unwrap(),
                    r["event_date"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect();
    assert_eq!(
        read, expected,
        "the appended files hold the adjustments and nothing else"
    );

    // `diff` compares the ledger's net rows: the fix, not the appended rows.
    let diff = json_ok(&lake.run(&[
        "diff",
        "ledger",
        "--from-version",
        &start.to_string(),
        "--to-version",
        &first.to_string(),
        "--output-format",
        "json",
    ]));
    let old_keys: BTreeMap<i64, Row> = original().into_iter().map(|r| (r.0, r)).collect();
    let new_keys: BTreeMap<i64, Row> = fixed(5).into_iter().map(|r| (r.0, r)).collect();
    let added = new_keys
        .keys()
        .filter(|k| !old_keys.contains_key(k))
        .count();
    let removed = old_keys
        .keys()
        .filter(|k| !new_keys.contains_key(k))
        .count();
    let changed = new_keys
        .iter()
        .filter(|(k, row)| old_keys.get(k).is_some_and(|old| old != *row))
        .count();
    let totals = &diff["comparison"]["totals"];
    assert_eq!(
        (
            totals["added"].as_u64(),
            totals["removed"].as_u64(),
            totals["changed"].as_u64()
        ),
        (
            Some(added as u64),
            Some(removed as u64),
            Some(changed as u64)
        ),
        "{diff}"
    );

    // The same run again appends nothing.
    let again = backfill(&lake, &[]);
    assert_eq!(again["outcome"], "already_published", "{again}");
    assert_eq!(version(&lake), first);

    // A second fix nets against the first: staged for review, then published.
    write_fix(&lake, "v2", 6);
    let staged = backfill(&lake, &["--stage-only"]);
    assert_eq!(staged["outcome"], "staged", "{staged}");
    assert_eq!(version(&lake), first, "nothing visible before publish");
    let second_id = staged["run_id"].as_str().unwrap().to_string();
    let published = json_ok(&lake.run(&["publish", &second_id, "--output-format", "json"]));
    assert_eq!(published["outcome"], "published", "{published}");
    let second = version(&lake);
    assert_eq!(commit_shape(&lake, second), (0, "Append".into()));
    assert_eq!(net(&lake.rows("ledger")), fixed(6));
    let changed = adjustments(&fixed(5), &fixed(6));
    assert_eq!(
        published["adjustments"]["reversals"].as_u64().unwrap() as usize
            + published["adjustments"]["corrections"].as_u64().unwrap() as usize,
        changed.len(),
        "only what the second fix changed: {published}"
    );

    // Its revert appends the negation: the first fix is what history says again.
    let reverted = json_ok(&lake.run(&["revert", &second_id, "--output-format", "json"]));
    assert_eq!(reverted["outcome"], "reverted", "{reverted}");
    assert_eq!(version(&lake), second + 1);
    assert_eq!(commit_shape(&lake, second + 1), (0, "Append".into()));
    assert_eq!(net(&lake.rows("ledger")), fixed(5));
    let event = newest_event(&lake);
    assert_eq!(event["type"], "backfill.reverted", "{event}");
    assert_eq!(event["revert_of"], second_id.as_str(), "{event}");
}

both_stores!(a_fix_of_an_append_only_ledger_is_appended_as_adjustments);

/// A row loaded twice into the ledger, which the fix computes once: the extra copy is reversed
/// once (rows count as often as they occur; an anti join, as DataFusion plans `EXCEPT ALL`,
/// reverses it never and the proof fails), and the ledger nets to the fixed history. A second
/// fix nets against that, touching only what it changes.
#[test]
fn a_row_loaded_twice_is_reversed_once() {
    let lake = ledger(Store::Local);
    lake.python(&["double_row", &lake.uri("ledger"), "201"]);
    let copies = |rows: &[Value], kind: Option<&str>| {
        rows.iter()
            .filter(|r| r["event_id"] == 201 && r["_lakefill_kind"].as_str() == kind)
            .count()
    };
    assert_eq!(copies(&lake.rows("ledger"), None), 2, "loaded twice");

    let report = backfill(&lake, &[]);
    assert_eq!(report["outcome"], "published", "{report}");
    let expected = adjustments(&original(), &fixed(5));
    let reversals = expected.iter().filter(|(k, _)| k == "reversal").count();
    assert_eq!(
        report["adjustments"]["reversals"],
        reversals + 1,
        "the fix's reversals and one of the extra copy: {report}"
    );
    assert_eq!(
        report["adjustments"]["corrections"],
        expected.len() - reversals,
        "{report}"
    );
    let rows = lake.rows("ledger");
    assert_eq!(copies(&rows, Some("reversal")), 1, "one copy taken back");
    assert_eq!(
        copies(&rows, Some("correction")),
        0,
        "event 201 is unchanged"
    );
    assert_eq!(net(&rows), fixed(5), "the ledger nets to the fixed history");

    write_fix(&lake, "v2", 6);
    let second = backfill(&lake, &["--model-version", "v2"]);
    assert_eq!(second["outcome"], "published", "{second}");
    let rows = lake.rows("ledger");
    assert_eq!(net(&rows), fixed(6));
    assert_eq!(copies(&rows, Some("reversal")), 1, "event 201 left alone");
    assert_eq!(
        second["adjustments"]["reversals"].as_u64().unwrap() as usize
            + second["adjustments"]["corrections"].as_u64().unwrap() as usize,
        adjustments(&fixed(5), &fixed(6)).len(),
        "only what the second fix changed: {second}"
    );
}

/// A ledger whose stored rows do not sum to its net rows (a reversal of a row it never held,
/// appended by another writer) blocks an adjustments run over that day: the proof, which starts
/// from the net rows, holds; the balance of the stored rows fails, naming the day, the measure
/// and the difference, and nothing is appended. Forced, the run publishes the same adjustments.
#[test]
fn a_ledger_whose_rows_do_not_balance_blocks_its_adjustments() {
    let lake = ledger(Store::Local);
    let first = backfill(&lake, &[]);
    assert_eq!(first["outcome"], "published", "{first}");
    lake.python(&["orphan_reversal", &lake.uri("ledger"), "888", "-40"]);
    let before = lake.rows("ledger");
    write_fix(&lake, "v2", 6);
    let out = backfill_output(&lake, &["--model-version", "v2"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("the report is printed");
    let check = |name: &str| {
        report["validation"]["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name}: {report}"))
            .clone()
    };
    assert_eq!(check("adjustments conserve")["passed"], true, "{report}");
    let balance = check("ledger balances");
    assert_eq!(balance["passed"], false, "{report}");
    assert_eq!(
        balance["failures"],
        serde_json::json!([{
            "event_date": "2026-01-01",
            "measure": "amount_cents",
            "buckets_off": 1,
            "stored_plus_adjustments_less_new": "-40",
        }]),
        "{report}"
    );
    assert_eq!(lake.rows("ledger"), before, "nothing appended");

    let report = backfill(
        &lake,
        &[
            "--model-version",
            "v2",
            "--force-publish",
            "--reason",
            "the hand-written reversal is known",
        ],
    );
    assert_eq!(report["outcome"], "published", "{report}");
    let rows = lake.rows("ledger");
    assert_eq!(net(&rows), fixed(6), "the ledger nets to the fix");
    let mut expected = sums(&before);
    for (id, amount) in fixed(6)
        .iter()
        .map(|r| (r.0, r.2))
        .chain(fixed(5).iter().map(|r| (r.0, -r.2)))
    {
        *expected.entry(id).or_default() += amount;
    }
    expected.retain(|_, amount| *amount != 0);
    let mut stored = sums(&rows);
    stored.retain(|_, amount| *amount != 0);
    assert_eq!(stored, expected, "the orphan stays as it was");
}

/// A decimal(18, 4) as text in units of its last place (`-0.0038` is -38).
fn ten_thousandths(text: &str) -> i128 {
    let (sign, digits) = match text.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, text),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let fraction = format!("{fraction:0<4}");
    assert_eq!(fraction.len(), 4, "{text}");
    sign * (whole.parse::<i128>().unwrap() * 10_000 + fraction.parse::<i128>().unwrap())
}

/// [`netted`] with (amount, fee in ten-thousandths).
fn net_measures(rows: &[Value]) -> BTreeMap<(i64, String, String), (f64, i128)> {
    netted(rows, |(amount, fee): &mut (f64, i128), row| {
        *amount += row["amount"].as_f64().unwrap();
        *fee += ten_thousandths(row["fee"].as_str().unwrap());
    })
}

/// Measures that are not integers: a double (whose sums differ in their last bits with the order
/// they are added in) and a decimal(18, 4) (summed exactly at its scale). A first fix and a second
/// one netted against it each publish with the ledger's balance passing, and the ledger, read
/// back by python, nets to each fix: the double to a relative 1e-12, the decimal exactly.
#[test]
fn double_and_decimal_measures_balance_and_net_to_the_fix() {
    let mut lake = PythonLake::new(Store::Local);
    lake.python(&["ledger_measures", "plain", &lake.uri("source")]);
    lake.python(&["ledger_measures", "append_only", &lake.uri("typed")]);
    lake.declare("source");
    lake.declare("typed");
    let model = |version: &str, amount: &str, fee: &str| {
        lake.model_version(
            "typed_fix",
            version,
            "target = \"typed\"\npartition_by = \"event_date\"\nschema = \"add-columns\"\n\
             publish = \"adjustments\"\nreason = \"measures were off\"\n\
             [sources.source]\nwindow = \"event_date\"\n\
             [validate]\nkey = [\"event_id\"]\nmeasures = [\"amount\", \"fee\"]",
            &format!(
                "SELECT event_id, country, {amount} AS amount, CAST({fee} AS DECIMAL(18, 4)) AS fee, event_date \
                 FROM source WHERE event_date BETWEEN $start AND $end"
            ),
        );
    };
    let first_amount = "CASE WHEN event_id % 2 = 0 THEN amount * 3 ELSE amount END";
    let first_fee = "CASE WHEN event_id % 2 = 1 THEN fee * 2 ELSE fee END";
    model("v1", first_amount, first_fee);
    model(
        "v2",
        &format!("CASE WHEN event_id % 3 = 0 THEN ({first_amount}) / 7 ELSE {first_amount} END"),
        &format!("CASE WHEN event_id % 4 = 0 THEN fee * 3 ELSE {first_fee} END"),
    );
    let source = lake.rows("source");
    let expected = |second: bool| -> BTreeMap<(i64, String, String), (f64, i128)> {
        source
            .iter()
            .map(|row| {
                let id = row["event_id"].as_i64().unwrap();
                let mut amount = row["amount"].as_f64().unwrap();
                let mut fee = ten_thousandths(row["fee"].as_str().unwrap());
                let day = row["event_date"].as_str().unwrap().to_string();
                if id % 2 == 0 {
                    amount *= 3.0;
                }
                if second && id % 3 == 0 {
                    amount /= 7.0;
                }
                if second && id % 4 == 0 {
                    fee *= 3;
                } else if id % 2 == 1 {
                    fee *= 2;
                }
                let country = row["country"].as_str().unwrap().to_string();
                ((id, country, day), (amount, fee))
            })
            .filter(|((_, _, day), _)| day.as_str() <= "2026-01-02")
            .chain(
                // The day after the range keeps its rows.
                source
                    .iter()
                    .filter(|row| row["event_date"].as_str().unwrap() > "2026-01-02")
                    .map(|row| {
                        (
                            (
                                row["event_id"].as_i64().unwrap(),
                                row["country"].as_str().unwrap().to_string(),
                                row["event_date"].as_str().unwrap().to_string(),
                            ),
                            (
                                row["amount"].as_f64().unwrap(),
                                ten_thousandths(row["fee"].as_str().unwrap()),
                            ),
                        )
                    }),
            )
            .collect()
    };
    for (version, second) in [("v1", false), ("v2", true)] {
        let report = json_ok(&lake.run(&[
            "backfill",
            "typed_fix",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
            "--model-version",
            version,
            "--output-format",
            "json",
        ]));
        assert_eq!(report["outcome"], "published", "{version}: {report}");
        let balance = report["validation"]["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "ledger balances")
            .unwrap_or_else(|| panic!("{version}: no balance: {report}"))
            .clone();
        assert_eq!(balance["passed"], true, "{version}: {report}");
        let net = net_measures(&lake.rows("typed"));
        let wanted = expected(second);
        assert_eq!(
            net.keys().collect::<Vec<_>>(),
            wanted.keys().collect::<Vec<_>>(),
            "{version}"
        );
        for (group, (amount, fee)) in &net {
            let (want_amount, want_fee) = wanted[group];
            assert!(
                (amount - want_amount).abs() <= 1e-12 * want_amount.abs().max(1.0),
                "{version} {group:?}: amount {amount} against {want_amount}"
            );
            assert_eq!(*fee, want_fee, "{version} {group:?}: fee");
        }
    }
}

/// `--where TRUE` selects every row: on a table published by adjustments it is the plan of the
/// whole table (how the Dagster integration reads a model's partitions), the same run as the
/// explicit range from the first to the last day, and it publishes.
#[test]
fn where_true_is_the_whole_table_for_adjustments() {
    let lake = ledger(Store::Local);
    let plan = |args: &[&str]| {
        let mut all = vec!["plan", "fix", "--output-format", "json"];
        all.extend_from_slice(args);
        json_ok(&lake.run(&all))
    };
    let whole = plan(&["--where", "TRUE"]);
    assert_eq!(whole["range"]["from"], "2026-01-01", "{whole}");
    assert_eq!(whole["range"]["to"], "2026-01-03", "{whole}");
    assert!(
        whole
            .to_string()
            .contains("`--where TRUE` selects every row"),
        "{whole}"
    );
    let explicit = plan(&["--from", "2026-01-01", "--to", "2026-01-03"]);
    assert_eq!(whole["run_id"], explicit["run_id"], "{whole}\n{explicit}");
    // Any other predicate is still refused for adjustments.
    let out = lake.run(&["plan", "fix", "--where", "event_id > 0"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    let report = json_ok(&lake.run(&[
        "backfill",
        "fix",
        "--where",
        "true",
        "--output-format",
        "json",
    ]));
    assert_eq!(report["outcome"], "published", "{report}");
    assert_eq!(report["run_id"], explicit["run_id"], "{report}");
    assert!(report["adjustments"]["corrections"].as_u64().unwrap() > 0);
}

/// Adjustments need a key and measures to negate, and lineage columns (or a model that may add
/// them): each missing piece is a model error before anything is staged.
#[test]
fn adjustments_without_what_they_need_are_refused() {
    let lake = ledger(Store::Local);
    let model = lake.path().join("sql/fix/v1.sql");
    let text = std::fs::read_to_string(&model).unwrap();
    for (edit, says) in [
        (
            text.replace("measures = [\"amount_cents\"]\n", ""),
            "measures",
        ),
        (
            text.replace("schema = \"add-columns\"\n", ""),
            "lineage columns",
        ),
        (
            text.replace("measures = [\"amount_cents\"]", "measures = [\"country\"]"),
            "signed numbers",
        ),
    ] {
        std::fs::write(&model, edit).unwrap();
        let out = lake.run(&[
            "backfill",
            "fix",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
        ]);
        assert_eq!(out.status.code(), Some(2), "{says}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{says}: {}", stderr(&out));
        assert!(stderr(&out).contains("hint:"), "{says}: {}", stderr(&out));
    }
    assert_eq!(lake.open("ledger").version(), Some(0), "nothing committed");

    // A companion must be a table of the project.
    std::fs::write(&model, text).unwrap();
    let project = lake.path().join("lakefill.toml");
    let toml = std::fs::read_to_string(&project).unwrap();
    std::fs::write(
        &project,
        toml.replacen(
            "[tables.ledger]\n",
            "[tables.ledger]\nadjustments = \"nope\"\n",
            1,
        ),
    )
    .unwrap();
    let out = lake.run(&["plan", "fix", "--from", "2026-01-01", "--to", "2026-01-02"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("`nope` is not a table of the project"),
        "{}",
        stderr(&out)
    );
}

/// Adjustment rows must keep the table's own rules (#33): a CHECK constraint on a measure,
/// which reversal rows negate, refuses adjustments at plan time by name; one on another column
/// holds for every appended row (python `deltalake` reads them back).
#[test]
fn issue_33_adjustments_keep_the_tables_rules() {
    let lake = ledger(Store::Local);
    let uri = lake.uri("ledger");
    lake.python(&["add_constraint", &uri, "positive", "amount_cents > 0"]);
    let version = lake.open("ledger").version();
    for command in ["plan", "backfill"] {
        let out = lake.run(&[command, "fix", "--from", "2026-01-01", "--to", "2026-01-02"]);
        assert_eq!(out.status.code(), Some(2), "{command}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("constraint positive") && stderr(&out).contains("`amount_cents`"),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(lake.open("ledger").version(), version, "nothing committed");

    let lake = ledger(Store::Local);
    let uri = lake.uri("ledger");
    lake.python(&["add_constraint", &uri, "known_event", "event_id > 0"]);
    let report = json_ok(&lake.run(&[
        "backfill",
        "fix",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
        "--output-format",
        "json",
    ]));
    assert_eq!(report["outcome"], "published", "{report}");
    let checks = report["validation"]["checks"].to_string();
    assert!(checks.contains("constraint known_event"), "{checks}");
    let rows: Vec<Value> = serde_json::from_str(&lake.python(&["all_rows", &uri])).unwrap();
    assert!(
        rows.iter().any(|r| r["_lakefill_kind"] == "reversal"),
        "{rows:?}"
    );
    assert!(rows.iter().all(|r| r["event_id"].as_i64().unwrap() > 0));
}

/// An adjustments run stopped at each point (staging, adjusting, validating, committing) is
/// finished by the same command with exactly one append, the first adjustments of a ledger and
/// those netted against them; discarded, it leaves nothing staged.
#[test]
fn a_stopped_adjustments_run_converges_and_a_discarded_one_leaves_nothing() {
    // Every point an adjustments run passes, generated from the engine's own list; the first
    // adjustments of the ledger (version 1), then a fix netted against them (version 2): a run
    // that goes through validates from the net rows its staging kept, one stopped after
    // adjusting is resumed by a process that nets them again.
    for (netted, version, bump) in [(false, 1, 5), (true, 2, 9)] {
        for point in CrashPoint::ALL
            .into_iter()
            .filter(|p| p.on_local_backfill(true))
        {
            let committed = point.phase() == CrashPhase::Committed;
            let point = crate::support::armed(point);
            let point = point.as_str();
            let lake = ledger(Store::Local);
            if netted {
                assert_eq!(backfill(&lake, &[])["outcome"], "published", "{point}");
                write_fix(&lake, "v2", bump);
            }
            let out = crate::support::lakefill_command(lake.path())
                .args([
                    "backfill",
                    "fix",
                    "--from",
                    "2026-01-01",
                    "--to",
                    "2026-01-02",
                ])
                .env("LAKEFILL_FAILPOINTS", point)
                .output()
                .unwrap();
            // A lost commit response is the one stop the run notices and reports as published.
            assert_eq!(
                out.status.success(),
                point.starts_with("lost-commit-response"),
                "{point}: {}",
                stderr(&out)
            );
            let report = backfill(&lake, &[]);
            let expected = if committed {
                "already_published"
            } else {
                "published"
            };
            assert_eq!(report["outcome"], expected, "{point}: {report}");
            assert_eq!(
                lake.open("ledger").version(),
                Some(version),
                "{point}: one append"
            );
            assert_eq!(
                net(&lake.rows("ledger")),
                fixed(bump),
                "{point}, netted {netted}"
            );
        }
    }

    let lake = ledger(Store::Local);
    let staged = backfill(&lake, &["--stage-only"]);
    let run_id = staged["run_id"].as_str().unwrap();
    let out = lake.run(&["discard", run_id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let leftovers: Vec<String> = crate::support::files_under(&lake.path().join("lake/ledger"))
        .into_iter()
        .filter(|p| p.contains("/lakefill-") && p.ends_with(".parquet"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert_eq!(lake.open("ledger").version(), Some(0));
}

/// With `adjustments = "ledger_adj"` in `lakefill.toml`, the adjustments go to a companion table
/// (created by the first backfill, never by `plan`) and the ledger is never written: the ledger's
/// rows with the companion's are the fixed history. A commit to the ledger in the range after
/// the run read it makes the publish a conflict; a revert appends the negation to the companion.
fn a_companion_table_takes_the_adjustments(store: Store) {
    let mut lake = ledger(store);
    lake.declare("ledger_adj");
    let project = lake.path().join("lakefill.toml");
    let toml = std::fs::read_to_string(&project).unwrap().replacen(
        "[tables.ledger]\n",
        "[tables.ledger]\nadjustments = \"ledger_adj\"\n",
        1,
    );
    std::fs::write(&project, toml).unwrap();
    // The ledger keeps its columns: the model need not add any.
    let model = lake.path().join("sql/fix/v1.sql");
    let text = std::fs::read_to_string(&model)
        .unwrap()
        .replace("schema = \"add-columns\"\n", "");
    std::fs::write(&model, text).unwrap();
    let both = |lake: &PythonLake| {
        let mut rows = lake.rows("ledger");
        rows.extend(lake.rows("ledger_adj"));
        rows
    };
    let ledger_files = lake.files("ledger");

    let plan = json_ok(&lake.run(&[
        "plan",
        "fix",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
        "--output-format",
        "json",
    ]));
    assert!(
        plan["range_notes"]
            .to_string()
            .contains("does not exist yet"),
        "{plan}"
    );
    let missing = lake.run(&["history", "ledger_adj"]);
    assert!(!missing.status.success(), "plan created nothing");

    let report = backfill(&lake, &[]);
    assert_eq!(report["outcome"], "published", "{report}");
    assert_eq!(report["table"], "ledger_adj", "{report}");
    assert_eq!(
        lake.files("ledger"),
        ledger_files,
        "the ledger is untouched"
    );
    let companion = lake.open("ledger_adj");
    let config = companion
        .snapshot()
        .unwrap()
        .metadata()
        .configuration()
        .clone();
    assert_eq!(
        config.get("delta.appendOnly").map(String::as_str),
        Some("true")
    );
    assert_eq!(companion.version(), Some(1), "created, then one append");
    assert_eq!(
        commit_shape_of(&lake, "ledger_adj", 1),
        (0, "Append".into())
    );
    assert_eq!(net(&both(&lake)), fixed(5), "ledger plus companion");
    let again = backfill(&lake, &[]);
    assert_eq!(again["outcome"], "already_published", "{again}");

    // Another writer appends to the ledger in the range after a second fix read it.
    write_fix(&lake, "v2", 6);
    let model = lake.path().join("sql/fix/v2.sql");
    let text = std::fs::read_to_string(&model)
        .unwrap()
        .replace("schema = \"add-columns\"\n", "");
    std::fs::write(&model, text).unwrap();
    let staged = backfill(&lake, &["--stage-only"]);
    let second = staged["run_id"].as_str().unwrap().to_string();
    lake.python(&["append_ledger", &lake.uri("ledger")]);
    let out = lake.run(&["publish", &second]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("ledger"), "{}", stderr(&out));
    assert_eq!(
        lake.open("ledger_adj").version(),
        Some(1),
        "nothing published"
    );

    // The first fix is reverted by appending its negation to the companion.
    let first = report["run_id"].as_str().unwrap();
    let reverted = json_ok(&lake.run(&["revert", first, "--output-format", "json"]));
    assert_eq!(reverted["outcome"], "reverted", "{reverted}");
    assert_eq!(
        commit_shape_of(&lake, "ledger_adj", 2),
        (0, "Append".into())
    );
    let mut expected = original();
    expected.insert((777, "FR".into(), 5, "2026-01-01".into()));
    assert_eq!(
        net(&both(&lake)),
        expected,
        "as before the fix, with the later append"
    );
}

both_stores!(a_companion_table_takes_the_adjustments);

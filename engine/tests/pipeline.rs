//! The engine on its own, without the CLI: plan, stage, validate and publish a backfill of the
//! demo lake on local disk through the library API, and check the published table against
//! plain arithmetic (the generator writes exactly `events_per_day` events per UTC day) and
//! against `raw_events` read with DataFusion directly.

use std::collections::BTreeMap;

use chrono::Days;
use deltalake::DeltaTable;
use deltalake::arrow::array::AsArray;
use deltalake::arrow::datatypes::Int64Type;
use deltalake::datafusion::prelude::SessionContext;
use lakefill::{BackfillBuilder, Outcome, PlanBuilder, Project, RunState};
use lakefill_fixtures::DemoLake;

const EVENTS_PER_DAY: u32 = 120;

fn lake() -> DemoLake {
    DemoLake {
        days: 6,
        events_per_day: EVENTS_PER_DAY,
        days_per_commit: 3,
        ..DemoLake::default()
    }
}

async fn open(dir: &std::path::Path, table: &str) -> DeltaTable {
    let url = url::Url::from_directory_path(dir.join("lake").join(table)).expect("url");
    deltalake::open_table(url).await.expect("open")
}

/// `SELECT <date>, count(*), sum(amount_cents) ... GROUP BY 1` over `table`, by date text.
async fn per_day(table: &DeltaTable, sql: &str) -> BTreeMap<String, (i64, i64)> {
    let ctx = SessionContext::new();
    ctx.register_table("t", table.table_provider().await.expect("provider"))
        .expect("register");
    let batches = ctx
        .sql(sql)
        .await
        .expect("plan")
        .collect()
        .await
        .expect("run");
    let mut out = BTreeMap::new();
    for batch in batches {
        let days = deltalake::arrow::compute::cast(
            batch.column(0),
            &deltalake::arrow::datatypes::DataType::Utf8,
        )
        .expect("cast");
        let days = days.as_string::<i32>();
        let counts = batch.column(1).as_primitive::<Int64Type>();
        let sums = batch.column(2).as_primitive::<Int64Type>();
        for row in 0..batch.num_rows() {
            out.insert(
                days.value(row).to_string(),
                (counts.value(row), sums.value(row)),
            );
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_stage_validate_then_publish_through_the_library() {
    let dir = tempfile::tempdir().expect("tempdir");
    let demo = lake();
    demo.create(dir.path()).await.expect("demo lake");
    let project = Project::load(dir.path()).expect("project");
    let (from, to) = (demo.start + Days::new(1), demo.start + Days::new(3));
    let events_before = open(dir.path(), "events").await;
    let version_before = events_before.version().expect("version");
    let by_day = "SELECT event_date, count(*), sum(amount_cents) FROM t GROUP BY event_date";
    let before = per_day(&events_before, by_day).await;

    // Plan: three day partitions, nothing written.
    // Three days of a time zone fix: keys cross both edges of the range, which the library
    // allows when asked to (the edge check itself is tested with the binary).
    let plan = PlanBuilder::new(&project, "events", from.to_string(), to.to_string())
        .with_settings(lakefill::RunSettings {
            batch_partitions: 2,
            ..lakefill::RunSettings::built_in()
        })
        .with_allow_edge_moves(Some("a partial fix, on purpose".into()))
        .await
        .expect("plan");
    let report = plan.report().clone();
    assert_eq!(report.partitions.len(), 3);
    assert_eq!(report.batches.len(), 2);
    assert_eq!(report.read_version, version_before);

    // Stage and validate only: readers see nothing yet.
    let staged = BackfillBuilder::new(plan)
        .with_stage_only(true)
        .await
        .expect("stage");
    assert_eq!(staged.outcome, Outcome::Staged);
    assert_eq!(staged.state, RunState::Validated);
    assert!(staged.validation.as_ref().is_some_and(|v| v.passed));
    assert_eq!(
        open(dir.path(), "events").await.version().expect("version"),
        version_before
    );

    // Publish the staged run: one new version.
    let published = lakefill::publish_run(&project, staged.run_id.as_str(), None)
        .await
        .expect("publish");
    assert_eq!(published.outcome, Outcome::Published);
    assert_eq!(published.published_version, Some(version_before + 1));
    let runs = lakefill::list_runs(&project, Some("events"))
        .await
        .expect("runs");
    assert!(
        runs.iter()
            .any(|r| r.run_id == staged.run_id && r.state == RunState::Published)
    );

    // Each day of the range holds exactly the day's events, with the amounts raw_events has
    // for that UTC day; every other day is as it was.
    let events_after = open(dir.path(), "events").await;
    let after = per_day(&events_after, by_day).await;
    let raw = per_day(
        &open(dir.path(), "raw_events").await,
        "SELECT CAST(event_ts AS DATE), count(*), sum(amount_cents) FROM t GROUP BY 1",
    )
    .await;
    let mut day = from;
    while day <= to {
        let label = day.to_string();
        assert_eq!(after[&label].0, i64::from(EVENTS_PER_DAY), "{label}");
        assert_eq!(after[&label], raw[&label], "{label}");
        day = day + Days::new(1);
    }
    for (label, counts) in &before {
        if label.as_str() < from.to_string().as_str() || label.as_str() > to.to_string().as_str() {
            assert_eq!(after.get(label), Some(counts), "{label} is untouched");
        }
    }

    // Published twice is still one commit.
    let again = lakefill::publish_run(&project, staged.run_id.as_str(), None)
        .await
        .expect("publish again");
    assert_eq!(again.outcome, Outcome::AlreadyPublished);
    assert_eq!(
        open(dir.path(), "events").await.version().expect("version"),
        version_before + 1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adjustments_runs_read_what_staging_read_once_and_net_to_each_fix() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let seen = Flags::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(seen.clone()))
        .expect("the only subscriber of this test's process");
    let dir = tempfile::tempdir().expect("tempdir");
    let demo = lake();
    demo.create(dir.path()).await.expect("demo lake");
    // The demo's fix and its bug, published as adjustments (the lineage columns added with the
    // first).
    for (version, adjusted) in [("v2", "v2adj"), ("v1", "v1adj")] {
        let model = std::fs::read_to_string(dir.path().join(format!("sql/events/{version}.sql")))
            .expect("model");
        let model = model
            .replacen(
                "target = \"events\"",
                "target = \"events\"\npublish = \"adjustments\"\nschema = \"add-columns\"",
                1,
            )
            // (The bug as released had no validation rules; adjustments need a key.)
            .replacen(
                "*/",
                "[validate]\nkey = [\"event_id\"]\nmeasures = [\"amount_cents\"]\n*/",
                usize::from(version == "v1"),
            );
        std::fs::write(dir.path().join(format!("sql/events/{adjusted}.sql")), model)
            .expect("model");
    }
    let project = Project::load(dir.path()).expect("project");
    let (from, to) = (demo.start + Days::new(1), demo.start + Days::new(4));
    // The fix (the first adjustments: the stored rows are net), the bug again on two of its
    // days (netted against the fix's adjustments), the fix again (netted against both).
    let runs = [
        ("v2adj", from, to),
        ("v1adj", from + Days::new(1), from + Days::new(2)),
        ("v2adj", from, to),
    ];
    for (run, (version, start, end)) in runs.into_iter().enumerate() {
        seen.0.lock().expect("events").clear();
        let plan = PlanBuilder::new(&project, "events", start.to_string(), end.to_string())
            .with_model_version(Some(version.into()))
            .with_settings(lakefill::RunSettings {
                batch_partitions: 2,
                ..lakefill::RunSettings::built_in()
            })
            .with_allow_edge_moves(Some("a partial fix, on purpose".into()))
            .await
            .expect("plan");
        let batches = plan.report().batches.len();
        let report = BackfillBuilder::new(plan).await.expect("backfill");
        assert_eq!(report.outcome, Outcome::Published, "run {run}");
        assert!(
            report.validation.as_ref().is_some_and(|v| v.passed),
            "run {run}"
        );
        // Every batch was staged by this process: its new rows were counted from the writers'
        // hashes, not read for it, and the key merge took the old net rows as the difference
        // hashed them, not reading them again.
        let flags = seen.0.lock().expect("events").clone();
        assert_eq!(
            flags.get("staged adjustments/counted"),
            Some(&vec![true; batches]),
            "run {run}"
        );
        assert_eq!(
            flags.get("merged rows by key hash/old_captured"),
            Some(&vec![true]),
            "run {run}"
        );
        // Nor were any of the proof's sides read again: the stored rows were summed by the net
        // rows' scans, the adjustments as they were written.
        for side in ["previous", "ledger", "adjustments", "output"] {
            assert_eq!(
                flags.get(&format!("summed the proof's sides/read_{side}")),
                Some(&vec![false]),
                "run {run}, {side}"
            );
        }

        // The ledger's net rows per day (a reversal counts -1 and carries its amount negated)
        // are the day's events as the model of the last run over the day makes them: the fix
        // (raw_events' own days) but on the bug's days after its run.
        let events = open(dir.path(), "events").await;
        let net = per_day(
            &events,
            "SELECT event_date, CAST(SUM(CASE WHEN _lakefill_kind = 'reversal' THEN -1 ELSE 1 END) AS BIGINT), CAST(SUM(amount_cents) AS BIGINT) FROM t GROUP BY event_date",
        )
        .await;
        let raw = per_day(
            &open(dir.path(), "raw_events").await,
            "SELECT CAST(event_ts AS DATE), count(*), sum(amount_cents) FROM t GROUP BY 1",
        )
        .await;
        let mut day = start;
        while day <= end {
            let label = day.to_string();
            let fixed = net[&label] == raw[&label];
            assert_eq!(fixed, version == "v2adj", "run {run}, {label}");
            day = day + Days::new(1);
        }
    }
}

/// The boolean fields of the events of adjustments runs (whose model version ends in `adj`; the
/// process's other tests run others), by message and field name (`message/field`), in the order
/// they came.
#[derive(Clone, Default)]
struct Flags(std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, Vec<bool>>>>);

/// The model version of a run's span.
struct Version(String);

impl<S> tracing_subscriber::Layer<S> for Flags
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Visit(Option<String>);
        impl tracing::field::Visit for Visit {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "version" {
                    self.0 = Some(format!("{value:?}"));
                }
            }
        }
        let mut version = Visit(None);
        attrs.record(&mut version);
        if let (Some(version), Some(span)) = (version.0, ctx.span(id)) {
            span.extensions_mut().insert(Version(version));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        #[derive(Default)]
        struct Fields {
            message: String,
            flags: Vec<(&'static str, bool)>,
        }
        impl tracing::field::Visit for Fields {
            fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
                self.flags.push((field.name(), value));
            }
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.message = format!("{value:?}");
                }
            }
        }
        let adjusting = ctx.event_scope(event).is_some_and(|mut scope| {
            scope.any(|span| {
                span.extensions()
                    .get::<Version>()
                    .is_some_and(|v| v.0.ends_with("adj"))
            })
        });
        if !adjusting {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut seen = self.0.lock().expect("events");
        for (name, value) in fields.flags {
            seen.entry(format!("{}/{name}", fields.message))
                .or_default()
                .push(value);
        }
    }
}

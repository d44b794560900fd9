//! Cascades (DESIGN §4 `--cascade`): a fix of one table reaches every table computed from it.
//!
//! This module plans a cascade. The model graph comes from the model files (the newest version
//! of each model, or one pinned per model): an edge parent → child for each source of the child
//! that is another model's target. Cycles are refused, naming them. Ranges propagate through
//! each edge's window: a change of the parent on `[a, b]` reaches the child on
//! `[a − lookahead, b + lookback]` (a child row for `d` reads the parent's `d − lookback …
//! d + lookahead`, in the window's own grain), clipped to the partitions the child has and
//! rounded to the child's grain; a child of several parents takes the hull of what each edge
//! reaches. Nothing widens silently: a node that the windows make span more than `max_expansion`
//! times the root's range is an error with the numbers (rounding to a coarser grain of the child
//! itself does not count). Each node is then planned like any backfill.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use chrono::NaiveDateTime;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::explain::history::table_layout;
use lakefill_log::journal::RunKind;
use lakefill_recompute::plan::{BackfillPlan, PlanBuilder, source_window};
use lakefill_table::config::Project;
use lakefill_table::error::{Error, Result};
use lakefill_table::model::{Model, list_models};
use lakefill_table::partition::{Layout, PartitionRange};
use lakefill_table::run_id::RunId;
use lakefill_table::settings::RunSettings;
use lakefill_table::storage::open_table;
use lakefill_table::time::{Grain, Period};

pub(crate) mod manage;
pub(crate) mod parents;
pub(crate) mod run;

/// How far a node's range may span, relative to the root's, unless raised.
pub const DEFAULT_MAX_EXPANSION: f64 = 4.0;

/// Plans a cascade without writing anything.
#[must_use = "a CascadeBuilder does nothing until it is awaited"]
pub struct CascadeBuilder {
    project: Project,
    root: String,
    from: String,
    to: String,
    model_versions: BTreeMap<String, String>,
    max_expansion: Option<f64>,
    settings: RunSettings,
    reason: Option<String>,
    create_companion: bool,
    allow_edge_moves: Option<String>,
    rows: Option<String>,
}

/// A planned cascade: one backfill plan per node, in dependency order.
pub struct CascadePlan {
    report: CascadeReport,
    nodes: Vec<BackfillPlan>,
    settings: RunSettings,
}

impl CascadePlan {
    /// The printable, serializable view of the cascade.
    pub fn report(&self) -> &CascadeReport {
        &self.report
    }

    /// The plan of each node, parents before children.
    pub fn nodes(&self) -> &[BackfillPlan] {
        &self.nodes
    }
}

/// What `plan --cascade` shows.
#[derive(Debug, Clone, Serialize)]
pub struct CascadeReport {
    /// Derived from the runs of the nodes.
    pub cascade_id: String,
    /// The model the cascade starts from.
    pub root: String,
    /// Every node, parents before children.
    pub nodes: Vec<CascadeNode>,
    /// Every edge between models of the cascade, and what it does to the child's range.
    pub edges: Vec<CascadeEdge>,
    /// The widest a node's range may be, relative to the root's.
    pub max_expansion: f64,
    /// Partitions over every node.
    pub total_partitions: usize,
    /// Batches over every node.
    pub total_batches: usize,
    /// Bytes of the affected partitions over every node (from the logs).
    pub total_bytes: u64,
}

/// One node of a cascade.
#[derive(Debug, Clone, Serialize)]
pub struct CascadeNode {
    /// The model.
    pub model: String,
    /// Its version.
    pub version: String,
    /// The table it writes.
    pub target: String,
    /// Its run.
    pub run_id: String,
    /// The version of its target it reads and replaces.
    pub read_version: u64,
    /// Its range.
    pub range: PartitionRange,
    /// Why this range: `root`, or what each incoming edge reaches.
    pub why: Vec<String>,
    /// Partitions.
    pub partitions: usize,
    /// Batches.
    pub batches: usize,
    /// Bytes of the affected partitions.
    pub bytes: u64,
    /// Its sources and the versions they are read at (a parent in the cascade is read as its
    /// staged output instead).
    pub sources: BTreeMap<String, u64>,
}

/// One edge: a child model reading a parent model's table.
#[derive(Debug, Clone, Serialize)]
pub struct CascadeEdge {
    /// The parent model.
    pub parent: String,
    /// The child model.
    pub child: String,
    /// The table the child reads.
    pub table: String,
    /// The child's window column(s) on it, if it has one.
    pub window: Option<String>,
    /// Extra periods before the window.
    pub lookback: u32,
    /// Extra periods after the window.
    pub lookahead: u32,
    /// The grain of the window.
    pub grain: Option<Grain>,
    /// The range of the child this edge reaches (`None` when the child has no partition there).
    pub reaches: Option<(String, String)>,
    /// With `--where`: whether the predicate passes to the child (its table has the columns),
    /// or the child takes every row of its range.
    #[serde(rename = "where_passed")]
    pub where_passed: Option<bool>,
    /// In words.
    pub explanation: String,
}

impl CascadeBuilder {
    /// Plans a cascade from model `root` of `project` over its partitions `from..=to`.
    pub fn new(
        project: &Project,
        root: impl Into<String>,
        from: impl Into<String>,
        to: impl Into<String>,
    ) -> Self {
        Self {
            project: project.clone(),
            root: root.into(),
            from: from.into(),
            to: to.into(),
            model_versions: BTreeMap::new(),
            max_expansion: None,
            settings: RunSettings::built_in(),
            reason: None,
            create_companion: false,
            allow_edge_moves: None,
            rows: None,
        }
    }

    /// Scopes the root to the rows that match `predicate` (`--where`), and every model
    /// downstream whose table has the predicate's columns; the others take every row of the
    /// range the change reaches.
    ///
    /// By default, every row of each node's range.
    pub fn with_where(mut self, predicate: Option<String>) -> Self {
        self.rows = predicate;
        self
    }

    /// Lets every node publish even when keys cross its range's edges, recording `reason` (see
    /// [`PlanBuilder::with_allow_edge_moves`]).
    ///
    /// By default, keys that cross a node's edges fail the cascade's validation.
    pub fn with_allow_edge_moves(mut self, reason: Option<String>) -> Self {
        self.allow_edge_moves = reason;
        self
    }

    /// Pins model versions, per model.
    ///
    /// By default, the newest version of each model.
    pub fn with_model_versions(mut self, versions: BTreeMap<String, String>) -> Self {
        self.model_versions = versions;
        self
    }

    /// Allows nodes whose range spans up to `factor` times the root's.
    ///
    /// By default, [`DEFAULT_MAX_EXPANSION`].
    pub fn with_max_expansion(mut self, factor: Option<f64>) -> Self {
        self.max_expansion = factor;
        self
    }

    /// Plans and runs every node with `settings`, resolved once (see
    /// [`crate::BackfillBuilder::with_settings`]). A cascade is staged in this process: a
    /// cluster (`engine`) is refused before anything is planned.
    ///
    /// By default, [`RunSettings::built_in`].
    pub fn with_settings(mut self, settings: RunSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Sets the reason recorded with every node's run.
    pub fn with_reason(mut self, reason: Option<String>) -> Self {
        self.reason = reason;
        self
    }

    /// Creates the companion tables of nodes that publish adjustments to one (see
    /// [`PlanBuilder::with_create_companion`]).
    ///
    /// By default, nothing is created.
    pub fn with_create_companion(mut self, create: bool) -> Self {
        self.create_companion = create;
        self
    }

    /// Plans the root, then each model downstream in dependency order: where its parents'
    /// changes reach it, whether that stays within `max_expansion`, and its own plan bound to
    /// its parents' staged output.
    async fn run(self) -> Result<CascadePlan> {
        let max_expansion = self.checked_limits()?;
        let graph = Graph::load(&self.project, &self.model_versions)?;
        let order = graph.order_from(&self.root)?;
        let root = self
            .plan_node(&self.root, self.from.clone(), self.to.clone())
            .with_where(self.rows.clone())
            .await?;
        // The predicate's columns, as the root's table resolved them.
        let predicate = root.report().range.rows.clone();
        let mut walk = Walk::from_root(&self.root, root)?;
        for child in order.iter().skip(1) {
            let Some(reached) = self.reach_of(&graph, child, &mut walk).await? else {
                continue;
            };
            let reached = self.with_own_past(&graph, child, reached, &mut walk);
            check_expansion(child, &reached, &walk, max_expansion)?;
            let (from, to) = labels(reached.grain, reached.rounded.0, reached.rounded.1);
            let passes = walk
                .edges
                .iter()
                .filter(|e| e.child == *child)
                .any(|e| e.where_passed == Some(true));
            let rows = predicate.as_ref().filter(|_| passes).map(|p| p.sql.clone());
            let mut plan = self.plan_node(child, from, to).with_where(rows).await?;
            bind_to_parents(&mut plan, &walk.parent_runs(&graph, child)).await?;
            walk.add(child, plan)?;
        }
        Ok(self.finish(walk, max_expansion))
    }

    /// The limits of the cascade, refused before anything is planned: no cluster, and an
    /// expansion factor of at least 1.
    fn checked_limits(&self) -> Result<f64> {
        if let Some(engine) = &self.settings.engine {
            return Err(Error::InvalidOption {
                option: "--engine".into(),
                value: engine.clone(),
                message:
                    "a cascade cannot be staged on a cluster yet; run it with `--engine local`"
                        .into(),
            });
        }
        let max_expansion = self.max_expansion.unwrap_or(DEFAULT_MAX_EXPANSION);
        if !(max_expansion >= 1.0 && max_expansion.is_finite()) {
            return Err(Error::InvalidOption {
                option: "--max-expansion".into(),
                value: max_expansion.to_string(),
                message: "a factor of 1 or more (a node's range over the root's)".into(),
            });
        }
        Ok(max_expansion)
    }

    /// The plan of one node over `from..=to`, with the cascade's settings.
    fn plan_node(&self, model: &str, from: String, to: String) -> PlanBuilder {
        PlanBuilder::new(&self.project, model, from, to)
            .with_model_version(self.model_versions.get(model).cloned())
            .with_settings(self.settings.clone())
            .with_reason(self.reason.clone())
            .with_create_companion(self.create_companion)
            .with_allow_edge_moves(self.allow_edge_moves.clone())
    }

    /// Where the changes of `child`'s planned parents reach it (`None`: nowhere it has a
    /// partition); records each edge and why on the way.
    async fn reach_of(
        &self,
        graph: &Graph,
        child: &str,
        walk: &mut Walk,
    ) -> Result<Option<Reached>> {
        let model = &graph.models[child];
        let child_table = model.header().target.clone();
        let config = self
            .project
            .table(&child_table, &format!("model `{child}`"))?;
        let opened = open_table(config, None).await?;
        let layout = table_layout(&self.project, &child_table, &opened).ok_or_else(|| {
            Error::Partitioning {
                message: format!(
                    "cannot tell how `{child_table}` is partitioned by time, so the cascade cannot reach it"
                ),
                hint: format!(
                    "give model `{child}` a `partition_by` naming its time column, or run it by hand"
                ),
            }
        })?;
        let existing = existing_span(&layout, &opened);
        let passes = self.where_passes(&child_table, &opened)?;
        let mut rounded: Option<Span> = None;
        let mut exact: Option<Span> = None;
        let parents: Vec<String> = graph
            .parents(child)
            .filter(|p| walk.spans.contains_key(*p))
            .cloned()
            .collect();
        for parent in &parents {
            let (mut edge, reached) = self
                .edge(graph, child, parent, &layout, existing, walk)
                .await?;
            if let Some((passed, why)) = &passes {
                edge.where_passed = Some(*passed);
                edge.explanation.push_str(&format!("; {why}"));
            }
            walk.why
                .entry(child.to_string())
                .or_default()
                .push(edge.explanation.clone());
            walk.edges.push(edge);
            if let Some((by_grain, by_window)) = reached {
                rounded = Some(hull(rounded, by_grain));
                exact = Some(hull(exact, by_window));
            }
        }
        Ok(match (rounded, exact) {
            (Some(rounded), Some(exact)) => Some(Reached {
                rounded,
                exact,
                grain: layout.time.grain,
                existing,
            }),
            _ => None,
        })
    }

    /// With `--where`: whether the predicate passes to the model writing `table` (its table has
    /// every column the predicate reads), and why, in words.
    fn where_passes(
        &self,
        table: &str,
        opened: &deltalake::DeltaTable,
    ) -> Result<Option<(bool, String)>> {
        let Some(text) = &self.rows else {
            return Ok(None);
        };
        let schema = opened
            .snapshot()
            .map_err(|source| Error::Delta {
                context: format!("cannot read the snapshot of `{table}`"),
                source: Box::new(source),
            })?
            .snapshot()
            .arrow_schema();
        Ok(Some(
            match lakefill_table::scope::RowPredicate::parse(text, &schema, table) {
                Ok(_) => (
                    true,
                    format!(
                        "`--where {text}` passes to `{table}`, which has its columns: its other rows are kept"
                    ),
                ),
                Err(_) => (
                    false,
                    format!(
                        "`{table}` cannot take `--where {text}` (it lacks a column, or the types differ): every row of the range it reaches is recomputed"
                    ),
                ),
            },
        ))
    }

    /// The edge `parent` → `child`, and where the parent's change reaches the child through it:
    /// rounded to the child's grain (what is planned) and exact (what the expansion limit
    /// measures; a month recomputed for a day's change is the grain's doing, not a widening).
    async fn edge(
        &self,
        graph: &Graph,
        child: &str,
        parent: &str,
        layout: &Layout,
        existing: Option<Span>,
        walk: &Walk,
    ) -> Result<(CascadeEdge, Option<(Span, Span)>)> {
        let model = &graph.models[child];
        let table = graph.models[parent].header().target.clone();
        let spec = &model.header().sources[&table];
        let parent_config = self.project.table(&table, &format!("model `{child}`"))?;
        let parent_table = open_table(parent_config, None).await?;
        let window = source_window(model, &table, spec, &parent_table)?;
        let (ps, pe) = walk.spans[parent];
        let reach = match &window {
            Some(w) => reach(w.time.grain, ps, pe, spec.lookback, spec.lookahead),
            None => existing,
        };
        let reached_exact = reach.and_then(|(s, e)| clip((s, e), existing));
        let clipped = reached_exact.and_then(|(s, e)| round(layout.time.grain, s, e));
        let labels = clipped.map(|(s, e)| labels(layout.time.grain, s, e));
        let explanation = match (&window, &labels) {
            (Some(w), Some((from, to))) => format!(
                "{child} reads {table} from {} {}(s) before to {} after each {}: its change on {} ..= {} reaches {from} ..= {to}",
                spec.lookback,
                w.time.grain,
                spec.lookahead,
                w.time.grain,
                labels_of(&walk.spans[parent], w.time.grain).0,
                labels_of(&walk.spans[parent], w.time.grain).1,
            ),
            (None, Some((from, to))) => format!(
                "{child} reads all of {table} (no window): every partition it has, {from} ..= {to}"
            ),
            (_, None) => format!("{child} has no partition where the change of {table} reaches"),
        };
        let edge = CascadeEdge {
            parent: parent.to_string(),
            child: child.to_string(),
            table: table.clone(),
            window: spec.window.as_ref().map(|w| w.join(", ")),
            lookback: spec.lookback,
            lookahead: spec.lookahead,
            grain: window.as_ref().map(|w| w.time.grain),
            reaches: labels,
            where_passed: None,
            explanation,
        };
        Ok((edge, clipped.zip(reached_exact)))
    }

    /// A model that reads its own past carries a change into every later partition: its reach
    /// runs through its last partition.
    fn with_own_past(
        &self,
        graph: &Graph,
        child: &str,
        reached: Reached,
        walk: &mut Walk,
    ) -> Reached {
        let model = &graph.models[child];
        let own = model.header().sources.get(&model.header().target);
        let mut reached = reached;
        if let (Some(own), Some((_, last))) = (own, reached.existing)
            && own.window.is_some()
            && own.lookback > 0
            && last > reached.rounded.1
        {
            reached.rounded.1 = last;
            reached.exact.1 = last.max(reached.exact.1);
            walk.why.entry(child.to_string()).or_default().push(format!(
                "{child} reads its own past (lookback {}): the change reaches every later partition, through the last",
                own.lookback
            ));
        }
        reached
    }

    /// The cascade's plan: every node resumable by the cascade's command, and the cascade's id
    /// (a digest of its nodes' run ids).
    fn finish(self, walk: Walk, max_expansion: f64) -> CascadePlan {
        let Walk {
            why,
            mut plans,
            edges,
            ..
        } = walk;
        let mut resume = format!(
            "lakefill backfill {} --from {} --to {} --cascade",
            self.root, self.from, self.to
        );
        if let Some(predicate) = &self.rows {
            resume.push_str(&lakefill_table::scope::where_option(predicate));
        }
        for (model, version) in &self.model_versions {
            resume.push_str(&format!(" --model-version {model}={version}"));
        }
        for plan in &mut plans {
            plan.resume = Some(resume.clone());
        }
        let nodes: Vec<CascadeNode> = plans
            .iter()
            .map(|plan| {
                let r = plan.report();
                CascadeNode {
                    model: r.model.clone(),
                    version: r.model_version.clone(),
                    target: r.target.clone(),
                    run_id: r.run_id.to_string(),
                    read_version: r.read_version,
                    range: r.range.clone(),
                    why: why.get(&r.model).cloned().unwrap_or_default(),
                    partitions: r.partitions.len(),
                    batches: r.batches.len(),
                    bytes: r.totals.bytes,
                    sources: r
                        .sources
                        .iter()
                        .map(|s| (s.table.clone(), s.version))
                        .collect(),
                }
            })
            .collect();
        let digest = hex::encode(Sha256::digest(
            nodes
                .iter()
                .map(|n| n.run_id.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        ));
        for plan in &mut plans {
            plan.kind = RunKind::CascadeNode {
                cascade: format!("cascade-{}", &digest[..12]),
            };
        }
        let report = CascadeReport {
            cascade_id: format!("cascade-{}", &digest[..12]),
            root: self.root.clone(),
            total_partitions: nodes.iter().map(|n| n.partitions).sum(),
            total_batches: nodes.iter().map(|n| n.batches).sum(),
            total_bytes: nodes.iter().map(|n| n.bytes).sum(),
            nodes,
            edges,
            max_expansion,
        };
        CascadePlan {
            report,
            nodes: plans,
            settings: self.settings,
        }
    }
}

/// A span of time, first and last instant.
type Span = (NaiveDateTime, NaiveDateTime);

/// The smallest span holding `acc` and `span`.
fn hull(acc: Option<Span>, span: Span) -> Span {
    match acc {
        Some((start, end)) => (start.min(span.0), end.max(span.1)),
        None => span,
    }
}

/// Where the parents' changes reach a child.
struct Reached {
    /// Rounded to the child's grain: what is planned.
    rounded: Span,
    /// As the windows reach: what the expansion limit measures.
    exact: Span,
    /// The child's grain.
    grain: Grain,
    /// The partitions the child has.
    existing: Option<Span>,
}

/// What planning a cascade has found so far, node by node.
struct Walk {
    /// The root's span, the measure of every node's expansion.
    root_span: Span,
    /// Each planned node's span.
    spans: BTreeMap<String, Span>,
    /// Why each node is part of the cascade.
    why: BTreeMap<String, Vec<String>>,
    /// Each planned node's run.
    run_ids: BTreeMap<String, RunId>,
    /// The nodes' plans, in dependency order.
    plans: Vec<BackfillPlan>,
    /// Every edge followed.
    edges: Vec<CascadeEdge>,
}

impl Walk {
    fn from_root(root: &str, plan: BackfillPlan) -> Result<Self> {
        let root_span = span(&plan.report().range)?;
        Ok(Self {
            root_span,
            spans: BTreeMap::from([(root.to_string(), root_span)]),
            why: BTreeMap::from([(root.to_string(), vec!["root".to_string()])]),
            run_ids: BTreeMap::from([(root.to_string(), plan.report().run_id.clone())]),
            plans: vec![plan],
            edges: Vec::new(),
        })
    }

    /// The planned parents of `child`: each one's table and run.
    fn parent_runs(&self, graph: &Graph, child: &str) -> Vec<(String, RunId)> {
        graph
            .parents(child)
            .filter_map(|p| {
                let table = graph.models[p].header().target.clone();
                self.run_ids.get(p).map(|id| (table, id.clone()))
            })
            .collect()
    }

    fn add(&mut self, child: &str, plan: BackfillPlan) -> Result<()> {
        self.run_ids
            .insert(child.to_string(), plan.report().run_id.clone());
        self.spans
            .insert(child.to_string(), span(&plan.report().range)?);
        self.plans.push(plan);
        Ok(())
    }
}

/// Refuses a node whose windows make it span more than `max_expansion` times the root's range.
fn check_expansion(child: &str, reached: &Reached, walk: &Walk, max_expansion: f64) -> Result<()> {
    let (exact_start, exact_end) = reached.exact;
    let root_seconds = (walk.root_span.1 - walk.root_span.0).num_seconds().max(1) as f64;
    let factor = (exact_end - exact_start).num_seconds() as f64 / root_seconds;
    if factor > max_expansion {
        let (from, to) = labels(reached.grain, exact_start, exact_end);
        return Err(Error::Cascade {
            message: format!(
                "model `{child}` would be recomputed over {from} ..= {to}, {factor:.1} times the span of the root's range {} ..= {} (at most {max_expansion} without `--max-expansion`)",
                walk.plans[0].report().range.from,
                walk.plans[0].report().range.to
            ),
            hint: format!(
                "check the windows that lead to `{child}` (`lakefill plan --cascade` lists each edge); if the range is right, pass `--max-expansion {}`",
                factor.ceil()
            ),
        });
    }
    Ok(())
}

impl std::future::IntoFuture for CascadeBuilder {
    type Output = Result<CascadePlan>;
    type IntoFuture = futures::future::BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// The model graph of a project.
struct Graph {
    sql_dir: std::path::PathBuf,
    models: BTreeMap<String, Model>,
    /// Child model -> parent models.
    parents: BTreeMap<String, BTreeSet<String>>,
    /// Parent model -> child models.
    children: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    fn load(project: &Project, versions: &BTreeMap<String, String>) -> Result<Self> {
        for pinned in versions.keys() {
            if !list_models(&project.sql_dir()).contains(pinned) {
                return Err(Error::InvalidOption {
                    option: "--model-version".into(),
                    value: pinned.clone(),
                    message: format!("there is no model `{pinned}` under sql/"),
                });
            }
        }
        let mut models = BTreeMap::new();
        for name in list_models(&project.sql_dir()) {
            let model = Model::load(project, &name, versions.get(&name).map(String::as_str))?;
            models.insert(name, model);
        }
        let mut writers: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, model) in &models {
            if let Some(other) = writers.insert(&model.header().target, name) {
                return Err(Error::Cascade {
                    message: format!(
                        "models `{other}` and `{name}` both write table `{}`, so the cascade cannot tell which one computes it",
                        model.header().target
                    ),
                    hint: "one model per table: move one of them to another target".into(),
                });
            }
        }
        let mut parents: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut children: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (name, model) in &models {
            for table in model.header().sources.keys() {
                if let Some(parent) = writers.get(table.as_str())
                    && *parent != name
                {
                    parents
                        .entry(name.clone())
                        .or_default()
                        .insert((*parent).to_string());
                    children
                        .entry((*parent).to_string())
                        .or_default()
                        .insert(name.clone());
                }
            }
        }
        Ok(Self {
            sql_dir: project.sql_dir(),
            models,
            parents,
            children,
        })
    }

    fn parents<'a>(&'a self, model: &str) -> impl Iterator<Item = &'a String> {
        self.parents.get(model).into_iter().flatten()
    }

    /// `root` and every model downstream of it, parents before children; a cycle is an error
    /// naming it.
    fn order_from(&self, root: &str) -> Result<Vec<String>> {
        if !self.models.contains_key(root) {
            return Err(Error::UnknownModel {
                model: root.to_string(),
                dir: self.sql_dir.clone(),
                known: self.models.keys().cloned().collect(),
            });
        }
        // Everything reachable from the root.
        let mut reachable = BTreeSet::from([root.to_string()]);
        let mut queue = VecDeque::from([root.to_string()]);
        while let Some(model) = queue.pop_front() {
            for child in self.children.get(&model).into_iter().flatten() {
                if reachable.insert(child.clone()) {
                    queue.push_back(child.clone());
                }
            }
        }
        if let Some(cycle) = self.cycle(&reachable) {
            return Err(Error::Cascade {
                message: format!("the models form a cycle: {}", cycle.join(" -> ")),
                hint: "a cascade follows sources downstream; break the cycle (a model that reads its own table does so through its target, which is allowed)".into(),
            });
        }
        // Kahn's order over the reachable models, by name among equals.
        let mut pending: BTreeMap<&String, usize> = reachable
            .iter()
            .map(|m| {
                (
                    m,
                    self.parents(m).filter(|p| reachable.contains(*p)).count(),
                )
            })
            .collect();
        let mut ready: BTreeSet<&String> = pending
            .iter()
            .filter(|(_, n)| **n == 0)
            .map(|(m, _)| *m)
            .collect();
        let mut order = Vec::new();
        while let Some(model) = ready.pop_first() {
            order.push(model.clone());
            for child in self.children.get(model).into_iter().flatten() {
                if let Some(n) = pending.get_mut(child) {
                    *n -= 1;
                    if *n == 0 {
                        ready.insert(child);
                    }
                }
            }
        }
        Ok(order)
    }

    /// A cycle among `models`, as the models along it, first repeated at the end.
    fn cycle(&self, models: &BTreeSet<String>) -> Option<Vec<String>> {
        fn visit(
            graph: &Graph,
            model: &String,
            models: &BTreeSet<String>,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<Vec<String>> {
            if let Some(at) = path.iter().position(|m| m == model) {
                let mut cycle = path[at..].to_vec();
                cycle.push(model.clone());
                return Some(cycle);
            }
            if done.contains(model) {
                return None;
            }
            path.push(model.clone());
            for child in graph.children.get(model).into_iter().flatten() {
                if models.contains(child)
                    && let Some(cycle) = visit(graph, child, models, path, done)
                {
                    return Some(cycle);
                }
            }
            path.pop();
            done.insert(model.clone());
            None
        }
        let mut done = BTreeSet::new();
        models
            .iter()
            .find_map(|m| visit(self, m, models, &mut Vec::new(), &mut done))
    }
}

/// Gives a child the run id of a node of the cascade: derived from its own inputs except the
/// versions of its cascade parents, and from the parents' run ids instead (it reads their staged
/// output, which their run ids name; and the id stays the same once they are published).
async fn bind_to_parents(plan: &mut BackfillPlan, parents: &[(String, RunId)]) -> Result<()> {
    let tables: BTreeSet<&str> = parents.iter().map(|(t, _)| t.as_str()).collect();
    let own: Vec<lakefill_recompute::plan::SourcePlan> = plan
        .report
        .sources
        .iter()
        .filter(|s| !tables.contains(s.table.as_str()))
        .cloned()
        .collect();
    let base = lakefill_recompute::plan::run_id(
        &plan.model,
        &own,
        &plan.report.range,
        plan.report.allow_spill.is_some(),
        plan.report.publish,
    );
    let mut hasher = Sha256::new();
    hasher.update(format!("lakefill-cascade-node-v1\n{base}").as_bytes());
    for (table, id) in parents {
        hasher.update(format!("\nparent {table}={id}").as_bytes());
    }
    let run_id = RunId::derive(
        plan.model.name(),
        plan.model.version(),
        &hex::encode(hasher.finalize()),
    );
    let (already, sequence) = lakefill_recompute::plan::publish_state(
        &plan.target,
        &run_id,
        &plan.report.layout,
        &plan.report.range,
        plan.report.read_version,
    )
    .await?;
    plan.report.run_id = run_id;
    plan.report.already_published = already;
    plan.report.publish_sequence = sequence;
    Ok(())
}

/// The instants `[start, end)` a range covers.
fn span(range: &PartitionRange) -> Result<(NaiveDateTime, NaiveDateTime)> {
    let period = |label: &str| {
        Period::from_label(range.grain, label)
            .ok_or_else(|| Error::Internal(format!("`{label}` is not a {} period", range.grain)))
    };
    Ok((period(&range.from)?.start(), period(&range.to)?.end()))
}

/// What a change on `[start, end)` reaches through a window of `grain` with `lookback` and
/// `lookahead`: a row for `d` reads `d − lookback ..= d + lookahead`.
fn reach(
    grain: Grain,
    start: NaiveDateTime,
    end: NaiveDateTime,
    lookback: u32,
    lookahead: u32,
) -> Option<(NaiveDateTime, NaiveDateTime)> {
    let first = Period::containing(grain, start)?.offset(-i64::from(lookahead))?;
    let last = Period::containing(grain, end - chrono::Duration::microseconds(1))?
        .offset(i64::from(lookback))?;
    Some((first.start(), last.end()))
}

/// `[start, end)` within `existing` (the span of the child's partitions), if they overlap.
fn clip(
    (start, end): (NaiveDateTime, NaiveDateTime),
    existing: Option<(NaiveDateTime, NaiveDateTime)>,
) -> Option<(NaiveDateTime, NaiveDateTime)> {
    let (es, ee) = existing?;
    let (s, e) = (start.max(es), end.min(ee));
    (s < e).then_some((s, e))
}

/// `[start, end)` widened to whole periods of `grain`.
fn round(
    grain: Grain,
    start: NaiveDateTime,
    end: NaiveDateTime,
) -> Option<(NaiveDateTime, NaiveDateTime)> {
    let first = Period::containing(grain, start)?;
    let last = Period::containing(grain, end - chrono::Duration::microseconds(1))?;
    Some((first.start(), last.end()))
}

/// The first and last period labels of `[start, end)` in `grain`.
fn labels(grain: Grain, start: NaiveDateTime, end: NaiveDateTime) -> (String, String) {
    let label =
        |instant| Period::containing(grain, instant).map_or_else(String::new, |p| p.label());
    (label(start), label(end - chrono::Duration::microseconds(1)))
}

fn labels_of(span: &(NaiveDateTime, NaiveDateTime), grain: Grain) -> (String, String) {
    labels(grain, span.0, span.1)
}

/// The instants the partitions of a table cover, first to last (`None` when it has none).
fn existing_span(
    layout: &Layout,
    table: &deltalake::DeltaTable,
) -> Option<(NaiveDateTime, NaiveDateTime)> {
    let snapshot = table.snapshot().ok()?;
    let mapping = lakefill_table::mapping::ColumnMapping::of_snapshot(snapshot).ok()?;
    let periods: Vec<Period> = snapshot
        .log_data()
        .iter()
        .filter_map(|file| {
            layout
                .time
                .period_of(&mapping.logical_values(file.partition_values_map()))
                .ok()
                .flatten()
        })
        .collect();
    let first = periods.iter().map(Period::start).min()?;
    let last = periods.iter().map(Period::end).max()?;
    Some((first, last))
}

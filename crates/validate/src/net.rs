//! The algebra of adjustments over rows, as SQL: a table's *net* rows (each reversal cancels the
//! row it reversed), the adjustment rows that take old net rows to new rows, and their counts.
//! Used where the rows are read: a model's sources, validation, publishing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use deltalake::arrow::array::{ArrayRef, RecordBatch, StringArray};
use deltalake::arrow::compute::cast;
use deltalake::arrow::compute::kernels::numeric::neg;
use deltalake::arrow::datatypes::{Field, Schema, SchemaRef};
use deltalake::datafusion::error::{DataFusionError, Result as DfResult};
use deltalake::datafusion::execution::SendableRecordBatchStream;
use deltalake::datafusion::prelude::SessionContext;

use crate::multiset::{Change, Shape, difference};

use lakefill_table::adjustments::{
    AdjustmentCounts, CORRECTION, KIND_COLUMN, REASON_COLUMN, REVERSAL, RUN_ID_COLUMN, is_lineage,
};
use lakefill_table::error::{QueryContext, Result};
use lakefill_table::rowhash::{register_hash_functions, row_hash_sql};
use lakefill_table::sqltext::ident;

/// The net rows of `rows` (a view of the table): every column of `schema` in order, the
/// measures summed over the rows that are the same but for them and the lineage, kept while the
/// rows outnumber their reversals; the lineage columns NULL.
pub fn net_sql(rows: &str, schema: &Schema, measures: &[String]) -> String {
    let has_kind = schema.field_with_name(KIND_COLUMN).is_ok();
    let grouped: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|name| !is_lineage(name) && !measures.contains(name))
        .map(|name| ident(&name))
        .collect();
    let select: Vec<String> = schema
        .fields()
        .iter()
        .map(|field| {
            let name = field.name();
            let data_type = lakefill_table::types::without_metadata(field.data_type())
                .to_string()
                .replace('\'', "''");
            if is_lineage(name) {
                format!("arrow_cast(NULL, '{data_type}') AS {}", ident(name))
            } else if measures.contains(name) {
                format!("arrow_cast(SUM({0}), '{data_type}') AS {0}", ident(name))
            } else {
                ident(name)
            }
        })
        .collect();
    if !has_kind {
        // No adjustment was ever appended (the table has no lineage columns): its rows are its
        // net rows, and grouping them would only cost.
        let select: Vec<String> = schema
            .fields()
            .iter()
            .map(|field| ident(field.name()))
            .collect();
        return format!("SELECT {} FROM {rows}", select.join(", "));
    }
    let weight = format!(
        "CASE WHEN {} = '{REVERSAL}' THEN -1 ELSE 1 END",
        ident(KIND_COLUMN)
    );
    if grouped.is_empty() {
        return format!(
            "SELECT {} FROM {rows} HAVING SUM({weight}) > 0",
            select.join(", ")
        );
    }
    // Only the rows an adjustment may net with are grouped: those alike but for the measures
    // and the lineage with an adjustment row, found by a hash of those columns (a hash two
    // groups share only sends a few more rows to the grouping). The others are their own net
    // rows, as in a table no adjustment ever touched.
    let kind = ident(KIND_COLUMN);
    let plain: Vec<String> = schema
        .fields()
        .iter()
        .map(|field| {
            let name = field.name();
            if is_lineage(name) {
                let data_type = lakefill_table::types::without_metadata(field.data_type())
                    .to_string()
                    .replace('\'', "''");
                format!("arrow_cast(NULL, '{data_type}') AS {}", ident(name))
            } else {
                ident(name)
            }
        })
        .collect();
    let hash = row_hash_sql(
        &schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .filter(|name| !is_lineage(name) && !measures.contains(name))
            .collect::<Vec<_>>(),
    );
    format!(
        "WITH __lf_rows AS (SELECT *, {hash} AS __lf_g FROM {rows}), \
         __lf_adjusted AS (SELECT DISTINCT __lf_g FROM __lf_rows WHERE {kind} IS NOT NULL) \
         SELECT {plain} FROM __lf_rows LEFT ANTI JOIN __lf_adjusted \
         ON __lf_rows.__lf_g = __lf_adjusted.__lf_g WHERE {kind} IS NULL \
         UNION ALL \
         SELECT {select} FROM __lf_rows LEFT SEMI JOIN __lf_adjusted \
         ON __lf_rows.__lf_g = __lf_adjusted.__lf_g GROUP BY {group_by} HAVING SUM({weight}) > 0",
        plain = plain.join(", "),
        select = select.join(", "),
        group_by = grouped.join(", "),
    )
}

/// The adjustment rows that take the net rows `old` to the rows `new` (both registered views
/// with every column of `schema` but the lineage columns), in `schema`: a reversal (the measures
/// negated) of each old row that is not among the new rows, a correction for each new row that
/// is not among the old rows (a [`multiset`](crate::multiset) difference of whole rows), each
/// with the lineage columns. `counts` holds how many of each kind once the stream has ended.
pub async fn adjustment_rows(
    ctx: &SessionContext,
    old: &str,
    new: &str,
    schema: &SchemaRef,
    measures: &[String],
    run_id: &str,
    reason: Option<&str>,
) -> Result<Adjustments> {
    // Both sides in the schema's columns and types.
    let values: Vec<&Field> = schema
        .fields()
        .iter()
        .filter(|f| !is_lineage(f.name()))
        .map(AsRef::as_ref)
        .collect();
    let side = |table: &str| {
        let table = table.to_string();
        let select: Vec<String> = values
            .iter()
            .map(|field| {
                let data_type = lakefill_table::types::without_metadata(field.data_type())
                    .to_string()
                    .replace('\'', "''");
                format!("arrow_cast({0}, '{data_type}') AS {0}", ident(field.name()))
            })
            .collect();
        async move {
            ctx.sql(&format!(
                "SELECT {} FROM {}",
                select.join(", "),
                ident(&table)
            ))
            .await
            .query_context(|| format!("cannot read the {table} rows of the adjustments"))
        }
    };
    let (old, new) = (side(old).await?, side(new).await?);
    let counts = Arc::new(AdjustmentTally::default());
    let tally = Arc::clone(&counts);
    let out = Arc::clone(schema);
    let measures = measures.to_vec();
    let (run_id, reason) = (run_id.to_string(), reason.map(str::to_string));
    let shape: Shape = Arc::new(move |change, rows: RecordBatch| {
        let (kind, negate) = match change {
            Change::Removed => {
                tally
                    .reversals
                    .fetch_add(rows.num_rows() as u64, Ordering::Relaxed);
                (REVERSAL, true)
            }
            Change::Added => {
                tally
                    .corrections
                    .fetch_add(rows.num_rows() as u64, Ordering::Relaxed);
                (CORRECTION, false)
            }
        };
        let text = |value: Option<&str>| -> ArrayRef {
            Arc::new(StringArray::from(vec![value; rows.num_rows()]))
        };
        let columns = out
            .fields()
            .iter()
            .map(|field| {
                let column = match field.name().as_str() {
                    RUN_ID_COLUMN => text(Some(&run_id)),
                    KIND_COLUMN => text(Some(kind)),
                    REASON_COLUMN => text(reason.as_deref()),
                    name => {
                        let column = rows.column_by_name(name).ok_or_else(|| {
                            DataFusionError::Internal(format!("no column `{name}` in the rows"))
                        })?;
                        if negate && measures.iter().any(|m| m == name) {
                            neg(column)?
                        } else {
                            Arc::clone(column)
                        }
                    }
                };
                Ok(if column.data_type() == field.data_type() {
                    column
                } else {
                    cast(&column, field.data_type())?
                })
            })
            .collect::<DfResult<Vec<ArrayRef>>>()?;
        Ok(RecordBatch::try_new(Arc::clone(&out), columns)?)
    });
    Ok(Adjustments {
        rows: difference(old, new, Arc::clone(schema), shape),
        counts,
    })
}

/// The adjustment rows of a run, as they stream.
pub struct Adjustments {
    /// Reversals, then corrections.
    pub rows: SendableRecordBatchStream,
    /// How many of each kind the stream gave.
    pub counts: Arc<AdjustmentTally>,
}

/// Reversals and corrections counted as they stream.
#[derive(Debug, Default)]
pub struct AdjustmentTally {
    reversals: AtomicU64,
    corrections: AtomicU64,
}

impl AdjustmentTally {
    /// The counts so far.
    pub fn counts(&self) -> AdjustmentCounts {
        AdjustmentCounts {
            reversals: self.reversals.load(Ordering::Relaxed),
            corrections: self.corrections.load(Ordering::Relaxed),
        }
    }
}

/// Registers `name` in `ctx` as the net rows of the view `rows`.
pub async fn register_net(
    ctx: &SessionContext,
    name: &str,
    rows: &str,
    schema: &Schema,
    measures: &[String],
) -> Result<()> {
    register_hash_functions(ctx);
    let df = ctx
        .sql(&net_sql(rows, schema, measures))
        .await
        .query_context(|| {
            "cannot net the table's rows (reversals against what they reverse)".into()
        })?;
    ctx.register_table(name, df.into_view())
        .query_context(|| format!("cannot register the net rows as `{name}`"))?;
    Ok(())
}

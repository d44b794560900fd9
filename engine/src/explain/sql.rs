//! `sql`: read-only queries over the project's tables, at any version by time travel.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use deltalake::arrow::array::RecordBatch;
use deltalake::datafusion::sql::parser::DFParser;
use deltalake::datafusion::sql::resolve::resolve_table_references;
use deltalake::datafusion::sql::sqlparser::dialect::GenericDialect;
use futures::StreamExt;
use serde::Serialize;

use lakefill_table::config::Project;
use lakefill_table::error::{Error, QueryContext, Result};
use lakefill_table::model::check_read_only;
use lakefill_table::storage::{TableVersion, loaded_version, open_table_at};

/// The result of `lakefill sql`.
#[derive(Debug, Clone, Serialize)]
pub struct QueryResult {
    /// Column names.
    pub columns: Vec<String>,
    /// Rows as text values (`null` for NULL), at most `max_rows`.
    pub rows: Vec<Vec<Option<String>>>,
    /// Whether more rows existed than were kept.
    pub truncated: bool,
    /// Tables read, with the version each was read at.
    pub tables: BTreeMap<String, u64>,
    /// The batches, for rendering (not serialized).
    #[serde(skip)]
    pub batches: Vec<RecordBatch>,
}

impl QueryResult {
    /// Formats the kept rows as a text table.
    pub fn to_table(&self) -> Result<String> {
        deltalake::arrow::util::pretty::pretty_format_batches(&self.batches)
            .map(|t| t.to_string())
            .map_err(|e| Error::Internal(format!("cannot format the result: {e}")))
    }
}

/// Runs a read-only query over the project's tables. `name@VERSION` and `name@TIMESTAMP`
/// (RFC 3339) read a table by time travel; quote them: `"events@12"`.
pub async fn sql(project: &Project, query: &str, max_rows: usize) -> Result<QueryResult> {
    sql_in_release(project, query, max_rows, None).await
}

/// [`sql`], with every table of the cascade `cascade` that the query names without a version
/// read at the version that cascade published it as: a consistent release of all of them.
pub async fn sql_in_release(
    project: &Project,
    query: &str,
    max_rows: usize,
    cascade: Option<&str>,
) -> Result<QueryResult> {
    let release = match cascade {
        Some(id) => lakefill_log::journal::cascade::release(project, id).await?,
        None => BTreeMap::new(),
    };
    if query.len() > MAX_QUERY_BYTES {
        return Err(Error::InvalidOption {
            option: "QUERY".into(),
            value: shortened(query),
            message: format!(
                "the query is {} bytes long; `lakefill sql` takes at most {MAX_QUERY_BYTES}",
                query.len()
            ),
        });
    }
    let depth = longest_chain(query);
    if depth > MAX_CHAIN {
        return Err(Error::InvalidOption {
            option: "QUERY".into(),
            value: shortened(query),
            message: format!(
                "an expression of the query chains {depth} operators; `lakefill sql` plans at most \
                 {MAX_CHAIN} in one expression, as planning time and memory grow with the square \
                 of it: write a long OR of equalities as `IN (…)`, or sum in steps (subqueries)"
            ),
        });
    }
    let statements = DFParser::parse_sql_with_dialect(query, &GenericDialect {}).map_err(|e| {
        Error::InvalidOption {
            option: "QUERY".into(),
            value: shortened(query),
            message: format!("the SQL does not parse: {e}"),
        }
    })?;
    if statements.len() != 1 {
        return Err(Error::InvalidOption {
            option: "QUERY".into(),
            value: shortened(query),
            message: "give exactly one SELECT statement".into(),
        });
    }
    let statement = &statements[0];
    check_read_only(statement).map_err(|kind| Error::InvalidOption {
        option: "QUERY".into(),
        value: shortened(query),
        message: format!("{kind} statements are not allowed; `lakefill sql` only reads"),
    })?;
    let (references, _) =
        resolve_table_references(statement, false).map_err(|e| Error::InvalidOption {
            option: "QUERY".into(),
            value: shortened(query),
            message: format!("cannot list the tables it reads: {e}"),
        })?;

    // The same bound as a run's: `[defaults] memory_limit`, else the built-in share.
    let ctx = lakefill_table::resources::Resources::new(lakefill_table::settings::memory_limit(
        project, None,
    )?)
    .session();
    let mut tables = BTreeMap::new();
    for reference in references {
        let name = reference.table().to_string();
        let (base, at) = parse_table_at(&name)?;
        let at = match (at, release.get(base)) {
            (TableVersion::Latest, Some(version)) => TableVersion::Version(*version),
            (at, _) => at,
        };
        let config = project.table(base, "the query")?;
        let at = match at {
            // By the commit times `history` prints, not the log files' modification times.
            TableVersion::Timestamp(time) => {
                let latest = open_table_at(config, TableVersion::Latest).await?;
                match lakefill_log::version_at(&latest, time).await? {
                    Ok(version) => TableVersion::Version(version),
                    Err((_, first)) => {
                        return Err(Error::BeforeHistory {
                            table: base.to_string(),
                            at: time.to_rfc3339(),
                            first: first.map_or_else(|| "?".to_string(), |t| t.to_rfc3339()),
                        });
                    }
                }
            }
            at => at,
        };
        let opened = open_table_at(config, at).await?;
        lakefill_table::protocol::check_readable(&opened, base)?;
        tables.insert(name.clone(), loaded_version(&opened)?);
        let provider = opened
            .table_provider()
            .await
            .query_context(|| format!("cannot read `{name}`"))?;
        ctx.register_table(name.as_str(), provider)
            .query_context(|| format!("cannot register `{name}`"))?;
    }
    let options = lakefill_table::sqltext::read_only();
    let df = ctx
        .sql_with_options(query, options)
        .await
        .map_err(|source| Error::Sql {
            source: Box::new(source),
        })?;
    let columns: Vec<String> = df
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let mut stream = df.execute_stream().await.map_err(|source| Error::Sql {
        source: Box::new(source),
    })?;
    let mut kept = 0usize;
    let mut truncated = false;
    let mut batches = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|source| Error::Sql {
            source: Box::new(source),
        })?;
        if kept >= max_rows {
            truncated |= batch.num_rows() > 0;
            // Stop reading: nothing more will be shown.
            break;
        }
        let take = batch.num_rows().min(max_rows - kept);
        truncated |= take < batch.num_rows();
        kept += take;
        batches.push(batch.slice(0, take));
    }
    let mut rows = Vec::with_capacity(kept);
    for batch in &batches {
        for row in lakefill_validate::rows::batch_to_json(batch, batch.num_rows())? {
            rows.push(
                columns
                    .iter()
                    .map(|c| row.get(c).and_then(|v| v.as_str().map(str::to_string)))
                    .collect(),
            );
        }
    }
    Ok(QueryResult {
        columns,
        rows,
        truncated,
        tables,
        batches,
    })
}

/// The longest query `lakefill sql` runs.
const MAX_QUERY_BYTES: usize = 1024 * 1024;

/// The most binary operators one expression of a query may chain. DataFusion plans a chain
/// `a + b + c …` in time and memory that grow with the square of its length (measured, release
/// build: 1,000 terms 1.5 s, 2,000 5.2 s, 8,000 54 s, 60,000 past 20 GB).
const MAX_CHAIN: usize = 1_000;

/// The length of the longest chain of binary operators in `query`: within each parenthesis, the
/// operators between two list items (commas, clauses, CASE branches) count, and an expression
/// inside parentheses adds to the one around it. Read from the tokens, without parsing: the
/// tree of a long chain is what costs (as deep as the chain is long).
fn longest_chain(query: &str) -> usize {
    use deltalake::datafusion::sql::sqlparser::keywords::Keyword;
    use deltalake::datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, query).tokenize() else {
        return 0; // The parser says what is wrong.
    };
    // The operators of each open parenthesis so far, and their sum.
    let mut open = vec![0usize];
    let mut longest = 0;
    for token in tokens {
        let top = open.len() - 1;
        match token {
            Token::LParen => open.push(0),
            Token::RParen if open.len() > 1 => {
                open.pop();
            }
            Token::Comma => open[top] = 0,
            Token::Word(word) => match word.keyword {
                Keyword::AND | Keyword::OR => open[top] += 1,
                Keyword::SELECT
                | Keyword::FROM
                | Keyword::WHERE
                | Keyword::GROUP
                | Keyword::HAVING
                | Keyword::ORDER
                | Keyword::LIMIT
                | Keyword::WHEN
                | Keyword::THEN
                | Keyword::ELSE
                | Keyword::END
                | Keyword::ON
                | Keyword::UNION => open[top] = 0,
                _ => {}
            },
            Token::Plus
            | Token::Minus
            | Token::Mul
            | Token::Div
            | Token::Mod
            | Token::StringConcat
            | Token::Eq
            | Token::DoubleEq
            | Token::Neq
            | Token::Lt
            | Token::Gt
            | Token::LtEq
            | Token::GtEq
            | Token::Ampersand
            | Token::Pipe
            | Token::Caret => open[top] += 1,
            _ => {}
        }
        longest = longest.max(open.iter().sum());
    }
    longest
}

/// A query as error messages quote it: at most its first 120 characters.
fn shortened(query: &str) -> String {
    let mut chars = query.chars();
    let head: String = chars.by_ref().take(120).collect();
    if chars.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}

/// Splits `events@12` or `events@2026-01-31T00:00:00Z` into the table and its version.
fn parse_table_at(name: &str) -> Result<(&str, TableVersion)> {
    let Some((base, at)) = name.split_once('@') else {
        return Ok((name, TableVersion::Latest));
    };
    if let Ok(version) = at.parse::<u64>() {
        return Ok((base, TableVersion::Version(version)));
    }
    let time = DateTime::parse_from_rfc3339(at)
        .map(|t| t.with_timezone(&Utc))
        .or_else(|_| {
            chrono::NaiveDate::parse_from_str(at, "%Y-%m-%d").map(|d| {
                d.and_hms_opt(0, 0, 0)
                    .expect("midnight exists")
                    .and_utc()
            })
        })
        .map_err(|_| Error::InvalidOption {
            option: "QUERY".into(),
            value: name.to_string(),
            message: "after `@` give a version number or an RFC 3339 time, e.g. `events@12` or `events@2026-01-31T00:00:00Z`".into(),
        })?;
    Ok((base, TableVersion::Timestamp(time)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_are_counted_per_expression() {
        let chain = |n: usize| vec!["x"; n].join(" + ");
        assert_eq!(
            longest_chain("SELECT a + b, c * d FROM t WHERE e = 1 AND f = 2"),
            3
        );
        assert_eq!(longest_chain(&format!("SELECT {} FROM t", chain(10))), 9);
        // Many short expressions are not one long one.
        let many = vec!["a + b"; 5_000].join(", ");
        assert_eq!(longest_chain(&format!("SELECT {many} FROM t")), 1);
        // Parentheses nest into the expression around them.
        assert_eq!(longest_chain("SELECT a + (b + (c + d)) FROM t"), 3);
        assert_eq!(
            longest_chain("SELECT CASE WHEN a = 1 THEN b + c WHEN a = 2 THEN d END FROM t"),
            1
        );
        assert_eq!(
            longest_chain(&format!("SELECT {} FROM t", chain(8_000))),
            7_999
        );
    }

    #[test]
    fn table_references_with_versions_and_times() {
        assert!(matches!(
            parse_table_at("events"),
            Ok(("events", TableVersion::Latest))
        ));
        assert!(matches!(
            parse_table_at("events@12"),
            Ok(("events", TableVersion::Version(12)))
        ));
        assert!(matches!(
            parse_table_at("events@2026-01-31T00:00:00Z"),
            Ok(("events", TableVersion::Timestamp(_)))
        ));
        assert!(parse_table_at("events@yesterday").is_err());
    }
}

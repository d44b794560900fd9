//! Writing SQL text: quoting identifiers, and the options every query lakefill plans runs under.
//!
//! lakefill writes queries (aggregates, checks, the row diff) as SQL text over registered
//! tables; user SQL (models, checks, `lakefill sql`) is planned with the same read-only options.

use deltalake::datafusion::prelude::SQLOptions;

/// Quotes an identifier for SQL (`"name"`, with `"` doubled).
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Options that refuse DDL, DML and statements: only queries are planned.
pub fn read_only() -> SQLOptions {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

//! Writing SQL text: quoting identifiers, and the options every query lakefill plans runs under.
//!
//! lakefill writes queries (aggregates, checks, the row diff) as SQL text over registered
//! tables; user SQL (models, checks, `lakefill sql`) is planned with the same read-only options.

use deltalake::datafusion::prelude::SQLOptions;

/// Quotes an identifier for SQL (`"name"`, with `"` doubled).
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `value` (SQL) cast to `data_type` with `arrow_cast`, whose type text cannot carry the field
/// metadata of a column-mapped table's nested fields (see [`crate::types::without_metadata`]).
pub fn cast_sql(value: &str, data_type: &deltalake::arrow::datatypes::DataType) -> String {
    let text = crate::types::without_metadata(data_type)
        .to_string()
        .replace('\'', "''");
    format!("arrow_cast({value}, '{text}')")
}

/// Options that refuse DDL, DML and statements: only queries are planned.
pub fn read_only() -> SQLOptions {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

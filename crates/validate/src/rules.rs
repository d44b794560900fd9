//! The rules of a model's `[validate]` section.

use lakefill_table::error::{Error, Result};
use lakefill_table::model::{CheckSpec, ValidateSpec, check_read_only};
use lakefill_table::protocol::RowRule;

/// The rules of a model's `[validate]` section, parsed and checked against the target.
#[derive(Debug, Clone, Default)]
pub struct ValidationRules {
    /// The row identity (`validate.key`).
    pub key: Vec<String>,
    /// The measures summed and compared (`validate.measures`).
    pub measures: Vec<String>,
    /// The most the rows of a partition may change (`validate.max_row_change`).
    pub max_row_change: Option<Threshold>,
    /// The most a measure's sum may change (`validate.max_measure_change`).
    pub max_measure_change: Option<Threshold>,
    /// Measures whose totals over the range must not change (`validate.conserve`).
    pub conserve: Vec<String>,
    /// Measure of the target, and the table and column whose total it must equal.
    pub conserve_with: Vec<(String, String, String)>,
    /// The model's own checks (`[[validate.checks]]`).
    pub checks: Vec<CheckSpec>,
    /// Rules of the target's protocol (constraints, NOT NULL, invariants, generated columns).
    pub protocol: Vec<RowRule>,
    /// `GENERATED ALWAYS` identity columns the model passes through: every value must be one
    /// the table had.
    pub identity_kept: Vec<String>,
    /// Places to which float columns must agree to be equal (`None`: bit for bit).
    pub decimals: Option<u32>,
}

/// The most decimal places `validate.decimals` may ask for.
const MAX_DECIMALS: u32 = 15;

/// A limit on a change: a percentage of the old value, or an absolute amount.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    /// A percentage of the old value.
    Percent(f64),
    /// An absolute amount.
    Absolute(f64),
}

impl Threshold {
    fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        match text.strip_suffix('%') {
            Some(number) => number
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|n| *n >= 0.0)
                .map(Threshold::Percent),
            None => text
                .parse::<f64>()
                .ok()
                .filter(|n| *n >= 0.0)
                .map(Threshold::Absolute),
        }
    }

    /// Whether going from `old` to `new` exceeds the limit.
    pub fn exceeded(&self, old: f64, new: f64) -> bool {
        let change = (new - old).abs();
        match self {
            Threshold::Absolute(limit) => change > *limit,
            Threshold::Percent(limit) => {
                if old == 0.0 {
                    change > 0.0
                } else {
                    change / old.abs() * 100.0 > *limit
                }
            }
        }
    }

    /// The limit as the model writes it (`5%`, `100`).
    pub fn describe(&self) -> String {
        match self {
            Threshold::Percent(p) => format!("{p}%"),
            Threshold::Absolute(a) => format!("{a}"),
        }
    }
}

impl ValidationRules {
    /// Parses `spec`; `columns` are the target's columns. Errors name the model file's field.
    pub fn from_spec(
        spec: Option<&ValidateSpec>,
        columns: &[String],
        path: &std::path::Path,
    ) -> Result<Self> {
        let Some(spec) = spec else {
            return Ok(Self::default());
        };
        let model_error = |message: String, hint: String| Error::Model {
            path: path.to_path_buf(),
            message,
            hint,
        };
        let known = || {
            columns
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        for (field, names) in [
            ("key", &spec.key),
            ("measures", &spec.measures),
            ("conserve", &spec.conserve),
        ] {
            for name in names.iter() {
                if !columns.contains(name) {
                    return Err(model_error(
                        format!(
                            "`validate.{field}` names `{name}`, which the target does not have"
                        ),
                        format!("use columns of the target: {}", known()),
                    ));
                }
            }
        }
        let threshold = |field: &str, value: &Option<String>| -> Result<Option<Threshold>> {
            value
                .as_deref()
                .map(|text| {
                    Threshold::parse(text).ok_or_else(|| {
                        model_error(
                            format!("`validate.{field}` is `{text}`, which is neither a percentage nor a number"),
                            format!("write `{field} = \"5%\"` (relative to the old value) or `{field} = \"100\"` (absolute)"),
                        )
                    })
                })
                .transpose()
        };
        let mut conserve_with = Vec::new();
        for (measure, other) in &spec.conserve_with {
            if !columns.contains(measure) {
                return Err(model_error(
                    format!(
                        "`validate.conserve_with` names `{measure}`, which the target does not have"
                    ),
                    format!("use columns of the target: {}", known()),
                ));
            }
            let Some((table, column)) = other
                .split_once('.')
                .filter(|(t, c)| !t.is_empty() && !c.is_empty())
            else {
                return Err(model_error(
                    format!("`validate.conserve_with.{measure}` is `{other}`, not `table.column`"),
                    format!(
                        "write `conserve_with = {{ {measure} = \"events.amount_cents\" }}`: a table of the cascade (or a source of the model) and its column"
                    ),
                ));
            };
            conserve_with.push((measure.clone(), table.to_string(), column.to_string()));
        }
        for check in &spec.checks {
            let statements = deltalake::datafusion::sql::parser::DFParser::parse_sql_with_dialect(
                &check.sql,
                &deltalake::datafusion::sql::sqlparser::dialect::GenericDialect {},
            )
            .map_err(|e| {
                model_error(
                    format!("check `{}` does not parse: {e}", check.name),
                    "write the check as a SELECT over `output` and `previous` that returns the offending rows".into(),
                )
            })?;
            if statements.len() != 1 || statements.iter().any(|s| check_read_only(s).is_err()) {
                return Err(model_error(
                    format!("check `{}` must be one read-only SELECT", check.name),
                    "write the check as a SELECT over `output` and `previous` that returns the offending rows".into(),
                ));
            }
        }
        Ok(Self {
            key: spec.key.clone(),
            measures: spec.measures.clone(),
            max_row_change: threshold("max_row_change", &spec.max_row_change)?,
            max_measure_change: threshold("max_measure_change", &spec.max_measure_change)?,
            conserve: spec.conserve.clone(),
            conserve_with,
            checks: spec.checks.clone(),
            protocol: Vec::new(),
            identity_kept: Vec::new(),
            decimals: match spec.decimals {
                Some(places) if places > MAX_DECIMALS => {
                    return Err(model_error(
                        format!(
                            "`validate.decimals` is {places}; a double holds about 15 significant digits"
                        ),
                        format!(
                            "write `decimals = N` with N at most {MAX_DECIMALS}, the places to which float columns must agree"
                        ),
                    ));
                }
                places => places,
            },
        })
    }

    /// Measures to sum: the declared ones plus the conserved ones.
    pub fn summed_measures(&self) -> Vec<String> {
        let mut measures = self.measures.clone();
        for m in &self.conserve {
            if !measures.contains(m) {
                measures.push(m.clone());
            }
        }
        measures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_parse_and_compare() {
        assert_eq!(Threshold::parse("5%"), Some(Threshold::Percent(5.0)));
        assert_eq!(Threshold::parse(" 100 "), Some(Threshold::Absolute(100.0)));
        assert_eq!(Threshold::parse("five"), None);
        assert_eq!(Threshold::parse("-1"), None);
        assert!(Threshold::Percent(5.0).exceeded(100.0, 106.0));
        assert!(!Threshold::Percent(5.0).exceeded(100.0, 95.0));
        assert!(Threshold::Percent(5.0).exceeded(0.0, 1.0));
        assert!(!Threshold::Absolute(10.0).exceeded(100.0, 110.0));
        assert!(Threshold::Absolute(10.0).exceeded(100.0, 89.0));
    }
}

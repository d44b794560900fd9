//! Tables named through a catalog instead of by location: `uri = "glue://database/table"`, whose
//! location the AWS Glue Data Catalog keeps.
//!
//! A catalog name is resolved once per command, before anything opens a table (see
//! [`crate::config::Project::resolve_catalog`]), so that every step of one command sees one
//! location even if the catalog changes meanwhile.
//!
//! Written against `aws-sdk-glue` rather than delta-rs' `deltalake-catalog-glue` (1.0.0), which
//! does the same `GetTable` call but:
//! - turns a location into another by replacing `s3a` *anywhere* in it (a bucket named
//!   `s3archive` becomes `s3rchive`);
//! - takes a Spark placeholder location (`…-__PLACEHOLDER__`) for the table's, while Spark keeps
//!   the real path of a data-source table in the serde parameter `path`;
//! - reads credentials and region from the environment only, never from the project's
//!   `[storage]`;
//! - folds every AWS error into "Failed in an AWS SDK call", with nothing to hint from.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_sdk_glue::error::{ProvideErrorMetadata as _, SdkError};
use aws_sdk_glue::operation::get_table::GetTableError;
use url::Url;

/// The URL scheme of a table named through AWS Glue.
pub const GLUE_SCHEME: &str = "glue";

/// Storage option: the endpoint of the Glue API, when it is not AWS's (a test server). Also read
/// from the environment variable of the same name, as the AWS SDKs do.
pub const GLUE_ENDPOINT_OPTION: &str = "AWS_ENDPOINT_URL_GLUE";

/// Storage option: the Data Catalog to ask, when it is not the caller's account's (a catalog
/// shared from another account).
pub const GLUE_CATALOG_ID_OPTION: &str = "AWS_GLUE_CATALOG_ID";

/// Spark's stand-in for the location of a data-source table in a Hive-style catalog.
const PLACEHOLDER_SUFFIX: &str = "-__PLACEHOLDER__";

/// A table named through a catalog: `glue://database/table`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogName {
    /// The Glue database.
    pub database: String,
    /// The table in it.
    pub table: String,
}

impl std::fmt::Display for CatalogName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{GLUE_SCHEME}://{}/{}", self.database, self.table)
    }
}

impl CatalogName {
    /// Parses `glue://database/table`; `None` when `uri` names no catalog.
    pub fn parse(uri: &str) -> Option<Result<Self, String>> {
        let (scheme, rest) = uri.split_once("://")?;
        if !scheme.eq_ignore_ascii_case(GLUE_SCHEME) {
            return None;
        }
        let parts: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
        Some(match parts.as_slice() {
            [database, table] if !database.is_empty() && !table.is_empty() => Ok(Self {
                database: (*database).to_string(),
                table: (*table).to_string(),
            }),
            _ => Err(format!(
                "`{uri}` does not name a Glue table: write `glue://<database>/<table>`"
            )),
        })
    }

    /// Asks the Glue Data Catalog where the table is, with the table's storage options
    /// (region, credentials, [`GLUE_ENDPOINT_OPTION`], [`GLUE_CATALOG_ID_OPTION`]) over the AWS
    /// SDK's own sources (environment, profile, instance role).
    ///
    /// The error is a message and a hint, each naming what to check.
    pub async fn resolve(
        &self,
        options: &BTreeMap<String, String>,
    ) -> Result<Url, (String, String)> {
        let option = |names: &[&str]| {
            names.iter().find_map(|name| {
                options
                    .iter()
                    .find(|(key, _)| key.eq_ignore_ascii_case(name))
                    .map(|(_, value)| value.clone())
            })
        };
        let mut loader = aws_config::defaults(BehaviorVersion::latest()).timeout_config(
            aws_config::timeout::TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .operation_timeout(Duration::from_secs(30))
                .build(),
        );
        if let Some(region) = option(&["AWS_REGION", "AWS_DEFAULT_REGION", "region"]) {
            loader = loader.region(aws_config::Region::new(region));
        }
        if let (Some(key), Some(secret)) = (
            option(&["AWS_ACCESS_KEY_ID", "access_key_id"]),
            option(&["AWS_SECRET_ACCESS_KEY", "secret_access_key"]),
        ) {
            let token = option(&["AWS_SESSION_TOKEN", "session_token", "token"]);
            loader = loader.credentials_provider(aws_credential_types::Credentials::from_keys(
                key, secret, token,
            ));
        }
        if let Some(endpoint) = option(&[GLUE_ENDPOINT_OPTION]) {
            loader = loader.endpoint_url(endpoint);
        }
        let config = loader.load().await;
        let region = config
            .region()
            .map_or_else(|| "none set".to_string(), ToString::to_string);
        let client = aws_sdk_glue::Client::new(&config);
        let answer = client
            .get_table()
            .database_name(&self.database)
            .name(&self.table)
            .set_catalog_id(option(&[GLUE_CATALOG_ID_OPTION]))
            .send()
            .await
            .map_err(|e| self.explain(e, &region))?;
        let table = answer.table.ok_or_else(|| {
            (
                format!("Glue returned no table for `{self}`"),
                "check the database and table names".to_string(),
            )
        })?;
        let kind = table
            .parameters
            .as_ref()
            .and_then(|p| {
                p.iter()
                    .find(|(k, _)| {
                        k.eq_ignore_ascii_case("table_type")
                            || k.eq_ignore_ascii_case("spark.sql.sources.provider")
                    })
                    .map(|(_, v)| v.to_ascii_lowercase())
            })
            .unwrap_or_default();
        if !kind.is_empty() && kind != "delta" {
            return Err((
                format!("Glue registers `{self}` as an `{kind}` table, not a Delta table"),
                "lakefill backfills Delta tables; name a Delta table (its Glue parameter \
                 `table_type` is `DELTA`, or `spark.sql.sources.provider` is `delta`)"
                    .into(),
            ));
        }
        let descriptor = table.storage_descriptor.as_ref();
        let declared = descriptor
            .and_then(|d| d.location.clone())
            .filter(|l| !l.is_empty() && !l.ends_with(PLACEHOLDER_SUFFIX));
        let serde_path = descriptor
            .and_then(|d| d.serde_info.as_ref())
            .and_then(|s| s.parameters.as_ref())
            .and_then(|p| p.get("path").cloned())
            .filter(|l| !l.is_empty());
        let location = declared.or(serde_path).ok_or_else(|| {
            (
                format!("Glue keeps no location for `{self}`"),
                "the table needs a storage descriptor location (or, as Spark writes it, a \
                 serde parameter `path`) naming its Delta table, e.g. `s3://bucket/path`"
                    .to_string(),
            )
        })?;
        let url = Url::parse(location.trim()).map_err(|e| {
            (
                format!("Glue's location for `{self}`, `{location}`, is not a URL ({e})"),
                "fix the table's location in Glue".to_string(),
            )
        })?;
        if crate::store::Store::of_scheme(url.scheme()).is_none() || url.scheme() == "file" {
            return Err((
                format!(
                    "Glue's location for `{self}`, `{location}`, is not on a store lakefill \
                     opens"
                ),
                format!(
                    "a Glue table's location must be on an object store: {}",
                    crate::store::SUPPORTED_SCHEMES
                ),
            ));
        }
        Ok(url)
    }

    /// A message and a hint for a failed `GetTable`.
    fn explain(&self, error: SdkError<GetTableError>, region: &str) -> (String, String) {
        let name = self.to_string();
        let endpoint_hint = format!(
            "check the region (here {region}) and, for a test server, `{GLUE_ENDPOINT_OPTION}` in \
             `[storage]` or the environment"
        );
        match &error {
            SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) => (
                format!("the Glue endpoint did not answer when resolving `{name}`"),
                endpoint_hint,
            ),
            SdkError::ServiceError(service) => match service.err() {
                GetTableError::EntityNotFoundException(e) => (
                    format!(
                        "Glue has no table `{}` in database `{}` ({})",
                        self.table,
                        self.database,
                        e.message().unwrap_or("not found")
                    ),
                    format!(
                        "check the database and table names in `{name}`, the region (here \
                         {region}) and, for a catalog shared from another account, \
                         `{GLUE_CATALOG_ID_OPTION}`"
                    ),
                ),
                other => {
                    let code = other.code().unwrap_or("an error");
                    let refused = code.contains("AccessDenied")
                        || code.contains("UnrecognizedClient")
                        || code.contains("InvalidSignature")
                        || code.contains("ExpiredToken");
                    (
                        format!(
                            "Glue answered {code} when resolving `{name}`{}",
                            other
                                .message()
                                .map(|m| format!(": {m}"))
                                .unwrap_or_default()
                        ),
                        if refused {
                            "Glue refused the credentials: check `AWS_ACCESS_KEY_ID` and \
                             `AWS_SECRET_ACCESS_KEY` (in `[storage]` or the environment); they \
                             need `glue:GetTable` on the table"
                                .to_string()
                        } else {
                            endpoint_hint
                        },
                    )
                }
            },
            _ => (
                format!("resolving `{name}` in Glue failed: {}", error),
                endpoint_hint,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_glue_uri_names_a_database_and_a_table() {
        assert_eq!(
            CatalogName::parse("glue://sales/events").unwrap().unwrap(),
            CatalogName {
                database: "sales".into(),
                table: "events".into()
            }
        );
        assert_eq!(
            CatalogName::parse("GLUE://sales/events/")
                .unwrap()
                .unwrap()
                .to_string(),
            "glue://sales/events"
        );
        assert!(CatalogName::parse("s3://b/t").is_none());
        assert!(CatalogName::parse("lake/events").is_none());
        for bad in [
            "glue://sales",
            "glue://sales/",
            "glue:///events",
            "glue://a/b/c",
        ] {
            let message = CatalogName::parse(bad).unwrap().unwrap_err();
            assert!(
                message.contains("glue://<database>/<table>"),
                "{bad}: {message}"
            );
        }
    }
}

//! The kinds of store a table can live in, named by its location's scheme, and what each one
//! means for options, credentials from the environment and hints.
//!
//! delta-rs registers a store for each scheme (`deltalake`'s `s3` and `azure` features) and
//! object_store speaks them; this module only knows which is which, so that no other module
//! matches schemes itself.

use url::Url;

mod azure;

/// Where a table's files are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// The local file system (`file://`, or a path).
    Local,
    /// Amazon S3 or an S3-compatible server (`s3://`, `s3a://`).
    S3,
    /// Azure Blob Storage or ADLS Gen2 (`az://`, `azure://`, `abfs://`, `abfss://`, `adl://`).
    Azure,
}

/// The schemes lakefill opens tables at, as a user-facing list.
pub const SUPPORTED_SCHEMES: &str =
    "a path, `file://`, `s3://`, `s3a://`, `az://`, `abfss://`, `abfs://`, `azure://` or `adl://`";

impl Store {
    /// Prepares delta-rs' stores for this process: Azure's listings from an offset are made
    /// exact (see `azure.rs`). Idempotent and cheap; everything that opens a table calls it
    /// first.
    pub fn register_handlers() {
        azure::register();
    }

    /// The store a URL scheme names, if lakefill supports it.
    pub fn of_scheme(scheme: &str) -> Option<Self> {
        match scheme {
            "file" => Some(Self::Local),
            "s3" | "s3a" => Some(Self::S3),
            "az" | "azure" | "abfs" | "abfss" | "adl" => Some(Self::Azure),
            _ => None,
        }
    }

    /// The store of a table at `url` (a location the project file accepted).
    pub fn of(url: &Url) -> Self {
        Self::of_scheme(url.scheme()).unwrap_or(Self::Local)
    }

    /// The store of a location as written (`s3://…`, `abfss://…`, a path).
    pub fn of_uri(uri: &str) -> Self {
        uri.split_once("://")
            .and_then(|(scheme, _)| Self::of_scheme(&scheme.to_ascii_lowercase()))
            .unwrap_or(Self::Local)
    }

    /// Whether it is an object store, reached over the network.
    pub fn is_object_store(self) -> bool {
        !matches!(self, Self::Local)
    }

    /// Whether an environment variable configures this store: delta-rs fills in options from
    /// the environment that the project leaves unset (`AWS_*` for S3; `AZURE_*`, and Azurite's
    /// address for the emulator, for Azure).
    pub fn reads_from_env(self, variable: &str) -> bool {
        match self {
            Self::Local => false,
            Self::S3 => variable.starts_with("AWS_"),
            Self::Azure => variable.starts_with("AZURE_") || variable == "AZURITE_BLOB_STORAGE_URL",
        }
    }

    /// The options to check when a table of this store cannot be opened.
    pub fn options_hint(self) -> &'static str {
        match self {
            Self::Local => "the path, and that it is readable",
            Self::S3 => "the endpoint, region, credentials and `AWS_ALLOW_HTTP` for http endpoints",
            Self::Azure => {
                "the container (it must exist), `AZURE_STORAGE_ACCOUNT_NAME`, a key \
                 (`AZURE_STORAGE_ACCOUNT_KEY`) or SAS token (`AZURE_STORAGE_SAS_KEY`), and for \
                 an emulator `AZURE_STORAGE_ENDPOINT` with `AZURE_ALLOW_HTTP`, or \
                 `AZURE_STORAGE_USE_EMULATOR` with Azurite at `AZURITE_BLOB_STORAGE_URL` \
                 (default http://127.0.0.1:10000)"
            }
        }
    }

    /// A hint that fits what the store answered when a table could not be opened, if the
    /// answer says more than the generic [`Store::options_hint`]: an endpoint that does not
    /// answer, a container that does not exist, credentials it refused.
    pub fn diagnose(self, table: &str, message: &str) -> Option<String> {
        let lower = message.to_ascii_lowercase();
        let unreachable = lower.contains("error sending request")
            || lower.contains("connection refused")
            || lower.contains("dns error")
            || lower.contains("failed to lookup address")
            || lower.contains("tcp connect error");
        match self {
            Self::Azure if unreachable => Some(format!(
                "the Azure endpoint of `{table}` did not answer: check the account name (it \
                 names the endpoint, `<account>.blob.core.windows.net`) and \
                 `AZURE_STORAGE_ENDPOINT`; for Azurite, that it is running and where \
                 (`AZURE_STORAGE_ENDPOINT`, or `AZURITE_BLOB_STORAGE_URL` with \
                 `AZURE_STORAGE_USE_EMULATOR`, default http://127.0.0.1:10000)"
            )),
            Self::Azure if lower.contains("resourcenotfound") => Some(format!(
                "the endpoint of `{table}` has no such account: check `AZURE_STORAGE_ENDPOINT` \
                 (for Azurite `http://127.0.0.1:10000/<account>`) and \
                 `AZURE_STORAGE_ACCOUNT_NAME`"
            )),
            Self::Azure if lower.contains("containernotfound") => Some(format!(
                "the container in `tables.{table}.uri` does not exist in that account: create \
                 it (`az storage container create --name …`) or fix the location"
            )),
            Self::Azure
                if lower.contains("authenticationfailed")
                    || lower.contains("authorizationfailure")
                    || lower.contains("403 forbidden")
                    || lower.contains("invalid base64") =>
            {
                Some(format!(
                    "Azure refused the credentials of `{table}`: check \
                     `AZURE_STORAGE_ACCOUNT_NAME` and the key (`AZURE_STORAGE_ACCOUNT_KEY`) or \
                     SAS token (`AZURE_STORAGE_SAS_KEY`: it must allow read, write, delete and \
                     list, and not have expired); `lakefill plan` lists the options in effect"
                ))
            }
            Self::S3 if unreachable => Some(format!(
                "the S3 endpoint of `{table}` did not answer: check `AWS_ENDPOINT_URL` (and \
                 that the server is running), the region, and `AWS_ALLOW_HTTP` for http"
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_name_their_store() {
        for (uri, store) in [
            ("s3://b/t", Store::S3),
            ("S3A://b/t", Store::S3),
            ("az://c/t", Store::Azure),
            ("abfss://c@acct.dfs.core.windows.net/t", Store::Azure),
            ("adl://c/t", Store::Azure),
            ("file:///tmp/t", Store::Local),
            ("lake/events", Store::Local),
        ] {
            assert_eq!(Store::of_uri(uri), store, "{uri}");
        }
        assert_eq!(Store::of_scheme("gs"), None);
    }

    #[test]
    fn only_a_stores_own_variables_configure_it() {
        assert!(Store::Azure.reads_from_env("AZURE_STORAGE_ACCOUNT_KEY"));
        assert!(Store::Azure.reads_from_env("AZURITE_BLOB_STORAGE_URL"));
        assert!(!Store::Azure.reads_from_env("AWS_REGION"));
        assert!(Store::S3.reads_from_env("AWS_REGION"));
        assert!(!Store::Local.reads_from_env("AWS_REGION"));
    }
}

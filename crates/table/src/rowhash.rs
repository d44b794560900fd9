//! Order-independent checksums of a partition's rows, to tell "the same rows" without joining.
//!
//! Each row gets a 64-bit hash of its values (every column but the partition columns, in the
//! target's column order); a partition's [`RowChecksum`] is its row count and the exact sum of
//! those hashes. Two partitions with equal checksums hold the same multiset of rows, but for a
//! chance of about 2⁻⁶⁴. The staging side computes the checksum while writing
//! ([`hash_rows`]), the old side in SQL through the `lakefill_row_hash` function
//! ([`register_hash_functions`]); both run the same code, so identical rows hash alike whatever Arrow flavour
//! (`Utf8` or `Utf8View`, dictionary or not) each side reads them in.
//!
//! Deciding what "up to date" means is left to validation (`lakefill::validate`).

use std::collections::BTreeMap;
use std::hash::BuildHasher as _;
use std::sync::Arc;

use deltalake::arrow::array::{Array, ArrayRef, AsArray, UInt64Array};
use deltalake::arrow::buffer::NullBuffer;
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::DataType;
use deltalake::datafusion::common::hash_utils::{RandomState, create_hashes};
use deltalake::datafusion::common::{DataFusionError, Result as DfResult};
use deltalake::datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The SQL name of the row hash function.
const ROW_HASH_FUNCTION: &str = "lakefill_row_hash";

/// The fixed hash state: the same seed in every process, so checksums stored in a journal can be
/// compared with ones computed later.
const STATE: RandomState = RandomState::with_seed(0x6c61_6b65_6669_6c6c);
/// What a NULL contributes (never the hash of a value, but for a 2⁻⁶⁴ chance).
const NULL_HASH: u64 = 0x9e37_79b9_7f4a_7c15;
/// The hash of a row with no columns to hash.
pub const EMPTY_ROW_HASH: u64 = 0x2545_f491_4f6c_dd1d;

/// Row count and sum of row hashes of one partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowChecksum {
    /// Rows.
    pub rows: u64,
    /// Sum of the rows' 64-bit hashes, exact (no wrap-around), as a decimal string in JSON.
    #[serde(with = "u128_text")]
    pub sum: u128,
}

impl RowChecksum {
    /// Adds rows with the given hashes.
    pub fn add_hashes(&mut self, hashes: &[u64]) {
        self.rows += hashes.len() as u64;
        self.sum += hashes.iter().map(|h| u128::from(*h)).sum::<u128>();
    }

    /// Adds another checksum (of other rows of the same partition).
    pub fn merge(&mut self, other: &RowChecksum) {
        self.rows += other.rows;
        self.sum += other.sum;
    }
}

/// Checksums per partition value.
pub type PartitionChecksums = BTreeMap<String, RowChecksum>;

mod u128_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(value: &u128, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&value.to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<u128, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The tag of a staged file's `add` action that carries its [`FileDigest`].
pub const DIGEST_TAG: &str = "lakefill.rowChecksum";

/// The version of what a [`FileDigest`] hashes and how; a digest of another version is ignored.
const DIGEST_VERSION: u64 = 1;

/// A data file's row checksum as lakefill wrote it into the file's `add` action (tag
/// [`DIGEST_TAG`]), so that a later comparison with that file's rows needs no scan of it.
///
/// It holds what it is a checksum of: the file's name (a tag copied onto another file is not
/// that file's), a fingerprint of the columns it hashed (names and types in order: a table
/// whose schema changed since has other rows), and for a file whose rows a deletion vector cuts,
/// a fingerprint of that vector (the checksum is of the rows it leaves). Whoever reads it also
/// checks that the file's vector is that one (or that it has none, as the digest says) and that
/// its live rows are the digest's: a writer that deletes rows by a vector keeps the file, and may
/// keep its tags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    #[serde(rename = "v")]
    version: u64,
    rows: u64,
    #[serde(with = "u128_text")]
    sum: u128,
    columns: String,
    file: String,
    /// The fingerprint of the file's deletion vector, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    vector: Option<String>,
}

impl FileDigest {
    /// The tag value for the file at `path` whose live rows (of the columns `fields`) have
    /// `checksum`, with the deletion vector whose fingerprint is `vector` if it has one.
    pub fn tag(
        checksum: &RowChecksum,
        fields: &[deltalake::arrow::datatypes::FieldRef],
        path: &str,
        vector: Option<&str>,
    ) -> String {
        let digest = Self {
            version: DIGEST_VERSION,
            rows: checksum.rows,
            sum: checksum.sum,
            columns: columns_fingerprint(fields),
            file: file_name(path).to_string(),
            vector: vector.map(str::to_string),
        };
        serde_json::to_string(&digest).unwrap_or_default()
    }

    /// The checksum a tag gives the live rows of the file at `path` (`live` of them: its
    /// statistics' records less its deletion vector's, whose fingerprint is `vector`), when the
    /// tag is of this version, of that file with that vector (or none), of the columns whose
    /// fingerprint is `columns`, and of as many rows.
    pub fn read(
        tag: &str,
        path: &str,
        live: Option<u64>,
        vector: Option<&str>,
        columns: &str,
    ) -> Option<RowChecksum> {
        let digest: Self = serde_json::from_str(tag).ok()?;
        (digest.version == DIGEST_VERSION
            && digest.vector.as_deref() == vector
            && live == Some(digest.rows)
            && digest.columns == columns
            && digest.file == file_name(path))
        .then_some(RowChecksum {
            rows: digest.rows,
            sum: digest.sum,
        })
    }
}

/// The last segment of a file's path.
fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A fingerprint of the columns a row hash covers: their names and types in order, string,
/// binary and dictionary flavours as one (they hash alike).
pub fn columns_fingerprint(fields: &[deltalake::arrow::datatypes::FieldRef]) -> String {
    use sha2::{Digest as _, Sha256};
    let mut hasher = Sha256::new();
    for field in fields {
        hasher.update(field.name().as_bytes());
        hasher.update([0]);
        hasher.update(key_type_class(field.data_type()).to_string().as_bytes());
        hasher.update([0]);
    }
    hex::encode(&hasher.finalize()[..12])
}

/// Hashes every row of `columns` (all of length `rows`).
pub fn hash_rows(columns: &[ArrayRef], rows: usize) -> Result<Vec<u64>> {
    hash_rows_with(&STATE, columns, rows)
}

/// Hashes every row of `columns` (all of length `rows`) with the independent seed of
/// [`check_hash_sql`]: a proof of what was matched by [`hash_rows`].
pub fn check_hashes(columns: &[ArrayRef], rows: usize) -> Result<Vec<u64>> {
    hash_rows_with(&CHECK_STATE, columns, rows)
}

/// [`hash_rows`] with the value hashes of `state`.
fn hash_rows_with(state: &RandomState, columns: &[ArrayRef], rows: usize) -> Result<Vec<u64>> {
    let values = columns
        .iter()
        .map(|c| value_hashes_with(state, c))
        .collect::<Result<Vec<_>>>()?;
    Ok(combine_rows(
        &values.iter().map(Vec::as_slice).collect::<Vec<_>>(),
        rows,
    ))
}

/// The hash of each value of `column` that [`hash_rows`] combines (a NULL's is fixed): to hash
/// rows of several sets of columns, each column is hashed once.
pub fn value_hashes(column: &ArrayRef) -> Result<Vec<u64>> {
    value_hashes_with(&STATE, column)
}

/// The hash of each value of `column` that [`check_hashes`] combines ([`value_hashes`] under the
/// check hash's seed).
pub fn check_value_hashes(column: &ArrayRef) -> Result<Vec<u64>> {
    value_hashes_with(&CHECK_STATE, column)
}

fn value_hashes_with(state: &RandomState, column: &ArrayRef) -> Result<Vec<u64>> {
    let mut values = vec![0u64; column.len()];
    column_value_hashes(state, column, &mut values)?;
    // The null buffer (what `Array::is_null` reads) looked at once, not for every row.
    if let Some(nulls) = column.nulls().filter(|n| n.null_count() > 0) {
        for (row, value) in values.iter_mut().enumerate() {
            if nulls.is_null(row) {
                *value = NULL_HASH;
            }
        }
    }
    Ok(values)
}

/// [`hash_rows`] of columns given by their [`value_hashes`], in order.
///
/// Compiled also for AVX-512 and AVX2, whichever the processor has being chosen when it runs
/// (`multiversion`, which does the feature detection and dispatch our `unsafe_code = "forbid"`
/// rules out writing here): there the 64-bit products of `mix` vectorize, 3.5 times as fast
/// with AVX-512 (8,192 rows of 5 columns: 15 µs against 53 µs). Integer arithmetic gives the same
/// hashes on every path; a test compares them with the plain loop.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512dq+avx512vl", "x86_64+avx2"))]
pub fn combine_rows(columns: &[&[u64]], rows: usize) -> Vec<u64> {
    let mut hashes = vec![EMPTY_ROW_HASH; rows];
    for (index, values) in columns.iter().enumerate() {
        let salt = (index as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        for (hash, value) in hashes.iter_mut().zip(values.iter()) {
            *hash = mix(hash.rotate_left(23) ^ value ^ salt);
        }
    }
    hashes
}

/// SplitMix64's finalizer: spreads every input bit over the output. (Inlined always, so that it
/// is compiled with the instructions of the [`combine_rows`] it is in.)
#[inline(always)]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hashes the values of one column (NULL rows are overwritten by the caller).
fn column_value_hashes(state: &RandomState, column: &ArrayRef, out: &mut [u64]) -> Result<()> {
    // Strings and bytes are hashed as bytes, whatever their Arrow flavour.
    let bytes = |values: &mut dyn Iterator<Item = Option<&[u8]>>, out: &mut [u64]| {
        for (slot, value) in out.iter_mut().zip(values) {
            *slot = value.map_or(NULL_HASH, |v| state.hash_one(v));
        }
    };
    match column.data_type() {
        DataType::Utf8 => bytes(
            &mut column
                .as_string::<i32>()
                .iter()
                .map(|v| v.map(str::as_bytes)),
            out,
        ),
        DataType::LargeUtf8 => bytes(
            &mut column
                .as_string::<i64>()
                .iter()
                .map(|v| v.map(str::as_bytes)),
            out,
        ),
        DataType::Utf8View => bytes(
            &mut column.as_string_view().iter().map(|v| v.map(str::as_bytes)),
            out,
        ),
        DataType::Binary => bytes(&mut column.as_binary::<i32>().iter(), out),
        DataType::LargeBinary => bytes(&mut column.as_binary::<i64>().iter(), out),
        DataType::BinaryView => bytes(&mut column.as_binary_view().iter(), out),
        DataType::Dictionary(_, value_type) => {
            let values = cast(column, value_type)
                .map_err(|e| Error::Internal(format!("cannot hash a dictionary column: {e}")))?;
            column_value_hashes(state, &values, out)?;
        }
        nested if crate::types::is_nested(nested) && &crate::types::canonical(nested) != nested => {
            // Strings inside structs, lists and maps hash as one type whatever their flavour.
            let values = cast(column, &crate::types::canonical(nested))
                .map_err(|e| Error::Internal(format!("cannot hash a nested column: {e}")))?;
            column_value_hashes(state, &values, out)?;
        }
        _ => {
            out.fill(0);
            create_hashes([Arc::clone(column)], state, out)
                .map_err(|e| Error::Internal(format!("cannot hash a column: {e}")))?;
        }
    }
    Ok(())
}

/// `columns` with every float and double value taken to `places` decimal places (NaN stays
/// NaN, -0 becomes 0), so that values computed in another order hash alike (#32).
fn rounded(columns: &[ArrayRef], places: u32) -> Result<Vec<ArrayRef>> {
    use deltalake::arrow::array::Float64Array;
    use deltalake::arrow::datatypes::Float64Type;
    let scale = 10f64.powi(i32::try_from(places).unwrap_or(i32::MAX));
    columns
        .iter()
        .map(|column| match column.data_type() {
            DataType::Float16 | DataType::Float32 | DataType::Float64 => {
                let doubles = cast(column, &DataType::Float64)
                    .map_err(|e| Error::Internal(format!("cannot round a float column: {e}")))?;
                let values: Float64Array = doubles
                    .as_primitive::<Float64Type>()
                    .unary(|v| ((v * scale).round() / scale) + 0.0);
                Ok(Arc::new(values) as ArrayRef)
            }
            _ => Ok(Arc::clone(column)),
        })
        .collect()
}

/// The SQL name of the check hash function: a row hash independent of [`hash_rows`], for
/// proofs about what was built with it.
const CHECK_HASH_FUNCTION: &str = "lakefill_check_hash";

/// The value hashes of the check hash, seeded apart from [`STATE`] and the key hashes'.
const CHECK_STATE: RandomState = RandomState::with_seed(0x6368_6563_6b5f_6873);

/// The SQL name of the key hash functions, before `_0` or `_1`.
const KEY_HASH_FUNCTION: &str = "lakefill_key_hash";

/// The value hashes of the two halves of a key hash: seeded apart from [`STATE`] and from each
/// other, so that the halves are independent 64-bit hashes and a key hash is 128 bits.
const KEY_STATES: [RandomState; 2] = [
    RandomState::with_seed(0x6b65_795f_6861_7368),
    RandomState::with_seed(0x7365_636f_6e64_5f68),
];

/// The hashes of every row's key `columns` under the state of `half` (0 or 1): `None` for a
/// row with a NULL in any key column (such a key equals no other, as in SQL).
pub fn key_hashes(half: usize, columns: &[ArrayRef], rows: usize) -> Result<UInt64Array> {
    let state = &KEY_STATES[half.min(1)];
    let hashes = hash_rows_with(state, columns, rows)?;
    let nulls: Vec<_> = columns.iter().map(|c| c.logical_nulls()).collect();
    let nulls = NullBuffer::union_many(nulls.iter().map(Option::as_ref));
    Ok(UInt64Array::new(hashes.into(), nulls))
}

/// Whether a key column of type `data_type` can be compared by [`key_hashes`]: two values hash
/// alike exactly when SQL's `=` holds. Not for floats (`-0.0 = 0.0` yet their bits differ; NaN)
/// nor nested types (whose equality treats nested NULLs its own way).
pub fn key_hashable(data_type: &DataType) -> bool {
    match data_type {
        DataType::Dictionary(_, value) => key_hashable(value),
        DataType::Float16 | DataType::Float32 | DataType::Float64 => false,
        t => {
            t.is_primitive()
                || matches!(
                    t,
                    DataType::Boolean
                        | DataType::Utf8
                        | DataType::LargeUtf8
                        | DataType::Utf8View
                        | DataType::Binary
                        | DataType::LargeBinary
                        | DataType::BinaryView
                        | DataType::FixedSizeBinary(_)
                )
        }
    }
}

/// The type a key column hashes as: string and binary flavours, and dictionaries, are one.
pub fn key_type_class(data_type: &DataType) -> DataType {
    match data_type {
        DataType::Dictionary(_, value) => key_type_class(value),
        DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
        DataType::LargeBinary | DataType::BinaryView => DataType::Binary,
        t => t.clone(),
    }
}

/// What a hash function of [`HashUdf`] computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum HashKind {
    /// [`hash_rows`] of the arguments.
    Row,
    /// One half (0 or 1) of [`key_hashes`] of the arguments, NULL when any is NULL.
    KeyHalf(usize),
    /// The check hash of the arguments ([`check_hash_sql`]).
    Check,
}

/// `lakefill_row_hash(col, ...)`, `lakefill_key_hash_0(col, ...)`, `lakefill_key_hash_1(col,
/// ...)` and `lakefill_check_hash(col, ...)`: the row hash, the two halves of the key hash and
/// the check hash, as `UInt64`s.
#[derive(Debug, PartialEq, Eq, Hash)]
struct HashUdf {
    kind: HashKind,
    name: String,
    signature: Signature,
    /// Places floats are rounded to before a row is hashed.
    decimals: Option<u32>,
}

/// Registers the hash functions in `ctx` (every query that hashes rows or keys needs them),
/// unless it has them already (then they stay as registered, e.g. rounding floats).
pub fn register_hash_functions(ctx: &deltalake::datafusion::prelude::SessionContext) {
    if ctx
        .state()
        .scalar_functions()
        .contains_key(ROW_HASH_FUNCTION)
    {
        return;
    }
    register_hash_functions_rounding(ctx, None);
}

/// Registers the hash functions in `ctx`, the row hash taking float and double values to
/// `decimals` places first when given (`[validate] decimals`: values that agree to that many
/// places are the same row). Key hashes never round.
pub fn register_hash_functions_rounding(
    ctx: &deltalake::datafusion::prelude::SessionContext,
    decimals: Option<u32>,
) {
    for (kind, name) in [
        (HashKind::Row, ROW_HASH_FUNCTION.to_string()),
        (HashKind::KeyHalf(0), format!("{KEY_HASH_FUNCTION}_0")),
        (HashKind::KeyHalf(1), format!("{KEY_HASH_FUNCTION}_1")),
        (HashKind::Check, CHECK_HASH_FUNCTION.to_string()),
    ] {
        ctx.register_udf(ScalarUDF::from(HashUdf {
            kind,
            name,
            signature: Signature::variadic_any(Volatility::Immutable),
            decimals,
        }));
    }
}

impl ScalarUDFImpl for HashUdf {
    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::UInt64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let rows = args.number_rows;
        let columns = ColumnarValue::values_to_arrays(&args.args)?;
        let hashes = match self.kind {
            HashKind::Row => match self.decimals {
                Some(places) => rounded(&columns, places).and_then(|c| hash_rows(&c, rows)),
                None => hash_rows(&columns, rows),
            }
            .map(UInt64Array::from),
            HashKind::KeyHalf(half) => key_hashes(half, &columns, rows),
            // Never rounded: a proof compares values as they are.
            HashKind::Check => hash_rows_with(&CHECK_STATE, &columns, rows).map(UInt64Array::from),
        }
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
        Ok(ColumnarValue::Array(Arc::new(hashes)))
    }
}

/// The SQL expression of one half (0 or 1) of the key hash of `columns`; the session must have
/// the [hash functions](register_hash_functions) registered.
pub fn key_hash_sql(half: usize, columns: &[String]) -> String {
    let columns: Vec<String> = columns.iter().map(|c| crate::sqltext::ident(c)).collect();
    format!(
        "{KEY_HASH_FUNCTION}_{}({})",
        half.min(1),
        columns.join(", ")
    )
}

/// The SQL expression of the check hash of a row's `columns`: like [`row_hash_sql`]'s, but
/// independent of it and never rounding floats. The session must have the
/// [hash functions](register_hash_functions) registered.
pub fn check_hash_sql(columns: &[String]) -> String {
    if columns.is_empty() {
        return format!("arrow_cast({EMPTY_ROW_HASH}, 'UInt64')");
    }
    let columns: Vec<String> = columns.iter().map(|c| crate::sqltext::ident(c)).collect();
    format!("{CHECK_HASH_FUNCTION}({})", columns.join(", "))
}

/// The SQL expression of the hash of a row's `columns` (the empty row's hash when there are
/// none); the session must have the [hash functions](register_hash_functions) registered.
pub fn row_hash_sql(columns: &[String]) -> String {
    if columns.is_empty() {
        // Typed like the function's result, so that readers of the hash see one type.
        return format!("arrow_cast({EMPTY_ROW_HASH}, 'UInt64')");
    }
    let columns: Vec<String> = columns.iter().map(|c| crate::sqltext::ident(c)).collect();
    format!("{ROW_HASH_FUNCTION}({})", columns.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Int64Array, StringArray, StringViewArray};

    fn strings(values: &[Option<&str>]) -> ArrayRef {
        Arc::new(StringArray::from(values.to_vec()))
    }

    #[test]
    fn string_flavours_hash_alike_and_nulls_and_positions_matter() {
        let utf8 = strings(&[Some("a"), None, Some("")]);
        let view: ArrayRef = Arc::new(StringViewArray::from(vec![Some("a"), None, Some("")]));
        let numbers: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), Some(1), None]));
        let a = hash_rows(&[Arc::clone(&utf8), Arc::clone(&numbers)], 3).expect("hash");
        let b = hash_rows(&[view, Arc::clone(&numbers)], 3).expect("hash");
        assert_eq!(a, b);
        // NULL and the empty string differ; so do swapped columns.
        assert_ne!(a[1], a[2]);
        let x = strings(&[Some("x")]);
        let y = strings(&[Some("y")]);
        let xy = hash_rows(&[Arc::clone(&x), Arc::clone(&y)], 1).expect("hash");
        let yx = hash_rows(&[y, x], 1).expect("hash");
        assert_ne!(xy, yx);
        // (NULL, 5) and (5, NULL) differ.
        let five: ArrayRef = Arc::new(Int64Array::from(vec![Some(5)]));
        let null: ArrayRef = Arc::new(Int64Array::from(vec![None::<i64>]));
        assert_ne!(
            hash_rows(&[Arc::clone(&null), Arc::clone(&five)], 1).expect("hash"),
            hash_rows(&[five, null], 1).expect("hash")
        );
    }

    /// Checksums outlive the process that computed them (in journals, and in the log's `add`
    /// actions): a dependency update that hashes values otherwise must fail here, and then
    /// [`DIGEST_VERSION`] goes up.
    #[test]
    fn row_and_key_hashes_are_the_same_in_every_build() {
        use deltalake::arrow::array::{BooleanArray, Date32Array, Float64Array};
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![Some(1), None, Some(-7)])),
            strings(&[Some("a"), Some(""), None]),
            Arc::new(Float64Array::from(vec![Some(0.5), Some(f64::NAN), None])),
            Arc::new(Date32Array::from(vec![Some(20_000), None, Some(0)])),
            Arc::new(BooleanArray::from(vec![Some(true), Some(false), None])),
        ];
        assert_eq!(
            hash_rows(&columns, 3).expect("hash"),
            [ROW_HASHES_0, ROW_HASHES_1, ROW_HASHES_2]
        );
        let key = key_hashes(0, &columns[..2], 3).expect("hash");
        assert_eq!(key.value(0), KEY_HASH_0);
        assert!(key.is_null(1) && key.is_null(2));
    }

    const ROW_HASHES_0: u64 = 11_293_213_331_387_191_521;
    const ROW_HASHES_1: u64 = 12_959_238_691_167_234_932;
    const ROW_HASHES_2: u64 = 2_498_201_167_385_652_990;
    const KEY_HASH_0: u64 = 11_762_836_231_654_406_213;

    #[test]
    fn a_file_digest_is_read_back_only_for_its_own_file_columns_and_live_rows() {
        use deltalake::arrow::datatypes::{DataType, Field};
        let fields: Vec<deltalake::arrow::datatypes::FieldRef> = vec![
            Arc::new(Field::new("id", DataType::Int64, false)),
            Arc::new(Field::new("name", DataType::Utf8, true)),
        ];
        let checksum = RowChecksum {
            rows: 3,
            sum: u128::from(u64::MAX) * 3,
        };
        let path = "day=2025-01-01/lakefill-r1/part-00000-abc.snappy.parquet";
        let tag = FileDigest::tag(&checksum, &fields, path, None);
        let columns = columns_fingerprint(&fields);
        assert_eq!(
            FileDigest::read(&tag, path, Some(3), None, &columns),
            Some(checksum)
        );
        // The same file moved elsewhere (a RESTORE keeps paths; a copy keeps the name) is itself.
        assert!(
            FileDigest::read(
                &tag,
                "part-00000-abc.snappy.parquet",
                Some(3),
                None,
                &columns
            )
            .is_some()
        );
        // Another file carrying the tag; a record count that is not the digest's; a deletion
        // vector; other columns (a renamed, retyped, added or reordered column); junk.
        assert_eq!(
            FileDigest::read(
                &tag,
                "day=2025-01-01/part-00001-def.snappy.parquet",
                Some(3),
                None,
                &columns
            ),
            None
        );
        assert_eq!(FileDigest::read(&tag, path, Some(2), None, &columns), None);
        assert_eq!(FileDigest::read(&tag, path, None, None, &columns), None);
        assert_eq!(
            FileDigest::read(&tag, path, Some(3), Some("v1"), &columns),
            None
        );
        // A digest of the rows a vector leaves: read only with that vector, not with another
        // nor with none (a writer that replaced or dropped the vector keeps the tag).
        let cut = FileDigest::tag(&checksum, &fields, path, Some("v1"));
        assert_eq!(
            FileDigest::read(&cut, path, Some(3), Some("v1"), &columns),
            Some(checksum)
        );
        assert_eq!(
            FileDigest::read(&cut, path, Some(3), Some("v2"), &columns),
            None
        );
        assert_eq!(FileDigest::read(&cut, path, Some(3), None, &columns), None);
        assert_eq!(
            FileDigest::read(&cut, path, Some(4), Some("v1"), &columns),
            None
        );
        let other_columns: [Vec<deltalake::arrow::datatypes::FieldRef>; 4] = [
            vec![
                Arc::clone(&fields[0]),
                Arc::new(Field::new("label", DataType::Utf8, true)),
            ],
            vec![
                Arc::clone(&fields[0]),
                Arc::new(Field::new("name", DataType::Int32, true)),
            ],
            vec![
                Arc::clone(&fields[0]),
                Arc::clone(&fields[1]),
                Arc::new(Field::new("x", DataType::Int64, true)),
            ],
            vec![Arc::clone(&fields[1]), Arc::clone(&fields[0])],
        ];
        for other in &other_columns {
            assert_eq!(
                FileDigest::read(&tag, path, Some(3), None, &columns_fingerprint(other)),
                None,
                "{other:?}"
            );
        }
        for junk in ["", "{}", "not json", &tag.replace("\"v\":1", "\"v\":2")] {
            assert_eq!(
                FileDigest::read(junk, path, Some(3), None, &columns),
                None,
                "{junk}"
            );
        }
        // String flavours and nullability hash alike, so they fingerprint alike.
        let view: Vec<deltalake::arrow::datatypes::FieldRef> = vec![
            Arc::new(Field::new("id", DataType::Int64, true)),
            Arc::new(Field::new("name", DataType::Utf8View, true)),
        ];
        assert_eq!(columns_fingerprint(&view), columns);
    }

    /// Whichever instructions [`combine_rows`] runs with, its hashes are those of the plain
    /// loop, for any number of rows and columns (vector loops handle a tail apart).
    #[test]
    fn rows_are_combined_alike_on_every_path() {
        let plain = |columns: &[&[u64]], rows: usize| {
            let mut hashes = vec![EMPTY_ROW_HASH; rows];
            for (index, values) in columns.iter().enumerate() {
                let salt = (index as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                for row in 0..rows {
                    let z = hashes[row].rotate_left(23) ^ values[row] ^ salt;
                    let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    hashes[row] = z ^ (z >> 31);
                }
            }
            hashes
        };
        let mut seed = 0x1234_5678_9abc_def0_u64;
        for rows in [0, 1, 7, 8, 9, 63, 64, 65, 1000, 8193] {
            for width in 0..6 {
                let columns: Vec<Vec<u64>> = (0..width)
                    .map(|_| {
                        (0..rows)
                            .map(|_| {
                                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                                seed ^ (seed >> 29)
                            })
                            .collect()
                    })
                    .collect();
                let columns: Vec<&[u64]> = columns.iter().map(Vec::as_slice).collect();
                assert_eq!(
                    combine_rows(&columns, rows),
                    plain(&columns, rows),
                    "{rows} rows, {width} columns"
                );
            }
        }
    }

    #[test]
    fn checksums_ignore_order_and_roundtrip_as_json() {
        let column = strings(&[Some("a"), Some("b"), Some("c")]);
        let reversed = strings(&[Some("c"), Some("b"), Some("a")]);
        let mut forward = RowChecksum::default();
        forward.add_hashes(&hash_rows(&[column], 3).expect("hash"));
        let mut backward = RowChecksum::default();
        backward.add_hashes(&hash_rows(&[reversed], 3).expect("hash"));
        assert_eq!(forward, backward);
        let json = serde_json::to_string(&forward).expect("json");
        assert_eq!(
            serde_json::from_str::<RowChecksum>(&json).expect("parse"),
            forward
        );
    }
}

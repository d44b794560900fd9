//! Deletion vectors: the rows of a data file that the table no longer holds, kept beside the file
//! instead of rewriting it (the Delta protocol's "Deletion Vectors" and "Deletion Vector Format").
//!
//! A vector is a set of row positions in its file (a portable `RoaringTreemap`). It lives inline
//! in the log (`i`), or in a vector file of the table (`u`: `deletion_vector_<uuid>.bin` under the
//! table's root, named in the log by the Z85 text of the uuid; `p`: an absolute path). A vector
//! file holds a version byte, then each vector as its size, magic, bitmap and CRC-32.
//!
//! Writing uses the kernel's `StreamingDeletionVectorWriter` (the format, its magic and CRC).
//! Reading is written here: the kernel's reader is synchronous, over a storage handler of its own
//! engine, where lakefill reads through the table's async object store; what it does is the few
//! lines of `parse`.
//!
//! A file gets a new vector by two actions of one commit: its `remove` (with the vector it had)
//! and its `add` again with the new vector, which holds the old one's rows too
//! ([`cut_add`]). Its statistics stay the file's, marked not tight (a deleted row may have
//! held a bound).

use std::ops::Range;

use bytes::Bytes;
use deltalake::ObjectStore;
use deltalake::kernel::{Add, DeletionVectorDescriptor, StorageType};
use deltalake::logstore::object_store::path::Path;
use deltalake::logstore::object_store::{ObjectStoreExt as _, PutPayload};
use roaring::RoaringTreemap;
use url::Url;

use crate::error::{Error, Result};

/// The magic number of a portable `RoaringTreemap` in a vector.
const PORTABLE_MAGIC: u32 = 1_681_511_377;

/// The CRC of a vector in a vector file (of its magic and bitmap).
const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);

/// The rows `descriptor` (a file's vector in the log of the table at `root`, whose store is
/// `store`) deletes; none without one.
pub async fn deleted_rows(
    store: &dyn ObjectStore,
    root: &Url,
    descriptor: Option<&DeletionVectorDescriptor>,
) -> Result<RoaringTreemap> {
    let Some(descriptor) = descriptor else {
        return Ok(RoaringTreemap::new());
    };
    let fail = |why: String| {
        Error::Internal(format!(
            "cannot read the deletion vector `{}` of `{root}`: {why}",
            descriptor.path_or_inline_dv,
        ))
    };
    match descriptor.storage_type {
        StorageType::Inline => {
            let bytes = z85::decode(&descriptor.path_or_inline_dv)
                .map_err(|e| fail(format!("not Z85 text ({e})")))?;
            let bitmap = bytes
                .strip_prefix(&PORTABLE_MAGIC.to_le_bytes())
                .ok_or_else(|| fail("not a portable RoaringTreemap (its magic)".into()))?;
            RoaringTreemap::deserialize_from(bitmap).map_err(|e| fail(e.to_string()))
        }
        StorageType::UuidRelativePath | StorageType::AbsolutePath => {
            let path = file_path(root, descriptor).map_err(fail)?;
            let start = usize::try_from(descriptor.offset.unwrap_or(1))
                .map_err(|_| fail("a negative offset".into()))?;
            let size = usize::try_from(descriptor.size_in_bytes)
                .map_err(|_| fail("a negative size".into()))?;
            // Its size, then magic and bitmap (`size` bytes), then the CRC.
            let range: Range<u64> = start as u64..(start + 4 + size + 4) as u64;
            let bytes = store
                .get_range(&path, range)
                .await
                .map_err(|e| fail(e.to_string()))?;
            parse(&bytes, size).map_err(fail)
        }
    }
}

/// One vector of a vector file (`bytes`: from its size field through its CRC), whose size the
/// log says is `size`.
fn parse(bytes: &Bytes, size: usize) -> std::result::Result<RoaringTreemap, String> {
    if bytes.len() != 4 + size + 4 || size < 4 {
        return Err(format!(
            "{} bytes, where the log says the vector has {size}",
            bytes.len()
        ));
    }
    let stored_size = u32::from_be_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize;
    if stored_size != size {
        return Err(format!(
            "the file says its size is {stored_size}, the log {size}"
        ));
    }
    let body = &bytes[4..4 + size];
    let crc = u32::from_be_bytes(bytes[4 + size..].try_into().expect("4 bytes"));
    if CRC.checksum(body) != crc {
        return Err("its CRC does not match (the file is damaged)".into());
    }
    let bitmap = body
        .strip_prefix(&PORTABLE_MAGIC.to_le_bytes())
        .ok_or("not a portable RoaringTreemap (its magic)")?;
    RoaringTreemap::deserialize_from(bitmap).map_err(|e| e.to_string())
}

/// The path, relative to the table's root `root`, of the vector file `descriptor` names (none for
/// an inline vector).
pub fn file_of(root: &Url, descriptor: &DeletionVectorDescriptor) -> Option<String> {
    match descriptor.storage_type {
        StorageType::Inline => None,
        _ => file_path(root, descriptor).ok().map(|p| p.to_string()),
    }
}

/// A fingerprint of the vector `descriptor` (where its bitmap is and how many rows it deletes):
/// what a file's [`crate::rowhash::FileDigest`] of the rows the vector leaves holds, so that the
/// digest is read only while the file has that vector.
pub fn fingerprint(descriptor: &DeletionVectorDescriptor) -> String {
    use sha2::{Digest as _, Sha256};
    let mut hasher = Sha256::new();
    for part in [
        descriptor.storage_type.as_ref().to_string(),
        descriptor.path_or_inline_dv.clone(),
        descriptor
            .offset
            .map_or_else(String::new, |o| o.to_string()),
        descriptor.size_in_bytes.to_string(),
        descriptor.cardinality.to_string(),
    ] {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    hex::encode(&hasher.finalize()[..12])
}

/// The path, in the table's object store, of the vector file `descriptor` names.
fn file_path(
    root: &Url,
    descriptor: &DeletionVectorDescriptor,
) -> std::result::Result<Path, String> {
    let kernel: delta_kernel::actions::deletion_vector::DeletionVectorDescriptor = descriptor
        .clone()
        .try_into()
        .map_err(|e: delta_kernel::Error| e.to_string())?;
    let mut root = root.clone();
    if !root.path().ends_with('/') {
        root.set_path(&format!("{}/", root.path()));
    }
    let url = kernel
        .absolute_path(&root)
        .map_err(|e| e.to_string())?
        .ok_or("an inline vector has no file")?;
    let relative = url
        .as_str()
        .strip_prefix(root.as_str())
        .ok_or_else(|| format!("`{url}` is outside the table"))?;
    Path::parse(relative).map_err(|e| e.to_string())
}

/// A vector file written for a run: its path in the table and the descriptor of each vector.
#[derive(Debug, Clone)]
pub struct WrittenVectors {
    /// Relative to the table's root.
    pub path: String,
    /// Of each vector given, in order.
    pub descriptors: Vec<DeletionVectorDescriptor>,
}

/// Writes `vectors` into one new vector file under the root of `store` (a table's; invisible
/// until a commit names it); returns its path and each vector's descriptor.
pub async fn write(
    store: &dyn ObjectStore,
    vectors: Vec<RoaringTreemap>,
) -> Result<WrittenVectors> {
    use delta_kernel::actions::deletion_vector_writer::{
        KernelDeletionVector, StreamingDeletionVectorWriter,
    };
    let id = uuid::Uuid::new_v4();
    let path = format!("deletion_vector_{id}.bin");
    let mut buffer = Vec::new();
    let mut writer = StreamingDeletionVectorWriter::new(&mut buffer);
    let mut written = Vec::with_capacity(vectors.len());
    for rows in vectors {
        let mut vector = KernelDeletionVector::new();
        vector.add_deleted_row_indexes(rows);
        written.push(writer.write_deletion_vector(vector).map_err(|e| {
            Error::Internal(format!("cannot write the deletion vector `{path}`: {e}"))
        })?);
    }
    writer
        .finalize()
        .map_err(|e| Error::Internal(format!("cannot write the deletion vector `{path}`: {e}")))?;
    let encoded = z85::encode(id.as_bytes());
    store
        .put(&Path::from(path.as_str()), PutPayload::from(buffer))
        .await
        .map_err(|source| Error::Storage {
            path: path.clone(),
            source,
        })?;
    let descriptors = written
        .into_iter()
        .map(|w| DeletionVectorDescriptor {
            storage_type: StorageType::UuidRelativePath,
            path_or_inline_dv: encoded.clone(),
            offset: Some(w.offset),
            size_in_bytes: w.size_in_bytes,
            cardinality: w.cardinality,
        })
        .collect();
    Ok(WrittenVectors { path, descriptors })
}

/// `file` (its `add` in the log) with the vector `descriptor` (which holds the rows of the one it
/// had too): the `add` that gives it the vector, in one commit with the `remove` of the file as
/// the log has it. Row ids stay the file's (`baseRowId`); its statistics stay, marked not tight.
pub fn cut_add(file: &Add, descriptor: DeletionVectorDescriptor) -> Add {
    let mut add = file.clone();
    add.deletion_vector = Some(descriptor);
    add.data_change = true;
    add.stats = file.stats.as_deref().map(loose_bounds);
    add
}

/// `stats` (a file's statistics, as JSON text) with its bounds marked not tight.
fn loose_bounds(stats: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(stats) {
        Ok(serde_json::Value::Object(mut stats)) => {
            stats.insert("tightBounds".into(), serde_json::Value::Bool(false));
            serde_json::Value::Object(stats).to_string()
        }
        _ => stats.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_file_is_read_back_and_a_damaged_one_refused() {
        use delta_kernel::actions::deletion_vector_writer::{
            KernelDeletionVector, StreamingDeletionVectorWriter,
        };
        let mut buffer = Vec::new();
        let mut writer = StreamingDeletionVectorWriter::new(&mut buffer);
        let mut first = KernelDeletionVector::new();
        first.add_deleted_row_indexes([1u64, 5, 70_000]);
        let mut second = KernelDeletionVector::new();
        second.add_deleted_row_indexes([0u64, (1 << 33) + 2]);
        let a = writer.write_deletion_vector(first).expect("first");
        let b = writer.write_deletion_vector(second).expect("second");
        writer.finalize().expect("finalize");
        let bytes = Bytes::from(buffer);
        let slice =
            |w: &delta_kernel::actions::deletion_vector_writer::DeletionVectorWriteResult| {
                let start = w.offset as usize;
                bytes.slice(start..start + 4 + w.size_in_bytes as usize + 4)
            };
        let rows = parse(&slice(&b), b.size_in_bytes as usize).expect("second");
        assert_eq!(rows.iter().collect::<Vec<_>>(), vec![0, (1 << 33) + 2]);
        let rows = parse(&slice(&a), a.size_in_bytes as usize).expect("first");
        assert_eq!(rows.iter().collect::<Vec<_>>(), vec![1, 5, 70_000]);
        let mut damaged = slice(&a).to_vec();
        damaged[10] ^= 1;
        let error = parse(&Bytes::from(damaged), a.size_in_bytes as usize).unwrap_err();
        assert!(error.contains("CRC"), "{error}");
        let error = parse(&slice(&a), a.size_in_bytes as usize + 1).unwrap_err();
        assert!(error.contains("bytes"), "{error}");
    }

    #[test]
    fn a_vector_is_fingerprinted_by_where_its_bitmap_is_and_what_it_deletes() {
        let vector = DeletionVectorDescriptor {
            storage_type: StorageType::UuidRelativePath,
            path_or_inline_dv: "ab^-aqEH.-t@S}K{vb[*k^".into(),
            offset: Some(1),
            size_in_bytes: 36,
            cardinality: 3,
        };
        assert_eq!(fingerprint(&vector), fingerprint(&vector.clone()));
        let others = [
            DeletionVectorDescriptor {
                storage_type: StorageType::AbsolutePath,
                ..vector.clone()
            },
            DeletionVectorDescriptor {
                path_or_inline_dv: "ab^-aqEH.-t@S}K{vb[*k_".into(),
                ..vector.clone()
            },
            DeletionVectorDescriptor {
                offset: Some(37),
                ..vector.clone()
            },
            DeletionVectorDescriptor {
                offset: None,
                ..vector.clone()
            },
            DeletionVectorDescriptor {
                size_in_bytes: 40,
                ..vector.clone()
            },
            DeletionVectorDescriptor {
                cardinality: 4,
                ..vector.clone()
            },
        ];
        for other in &others {
            assert_ne!(fingerprint(other), fingerprint(&vector), "{other:?}");
        }
    }

    #[test]
    fn statistics_of_a_cut_file_are_not_tight() {
        let stats = loose_bounds(r#"{"numRecords":3,"minValues":{"a":1}}"#);
        let stats: serde_json::Value = serde_json::from_str(&stats).expect("json");
        assert_eq!(stats["tightBounds"], false);
        assert_eq!(stats["numRecords"], 3);
    }
}

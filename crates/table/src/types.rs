//! Arrow types as a Delta table stores them (#32): one string type, one binary type, no
//! dictionaries, at every depth of a struct, list or map.
//!
//! DataFusion reads strings as `Utf8View` (also inside structs and lists), a model may produce
//! `LargeUtf8` or dictionaries, and a table's schema says `Utf8`: all are the same Delta type.
//! Schema checks compare types in this form, and row hashes hash nested values in it, so the
//! same rows hash alike whichever flavour each side was read in.

use std::sync::Arc;

use deltalake::arrow::datatypes::{DataType, Field};

/// `data_type` with no metadata on its nested fields: what SQL's `arrow_cast` can name (a
/// column-mapped table's nested fields carry their ids and physical names as metadata, which
/// the type's text would show and `arrow_cast` cannot parse).
pub fn without_metadata(data_type: &DataType) -> DataType {
    let field = |f: &Arc<Field>| {
        Arc::new(
            f.as_ref()
                .clone()
                .with_metadata(Default::default())
                .with_data_type(without_metadata(f.data_type())),
        )
    };
    match data_type {
        DataType::Struct(fields) => DataType::Struct(fields.iter().map(field).collect()),
        DataType::List(item) => DataType::List(field(item)),
        DataType::LargeList(item) => DataType::LargeList(field(item)),
        DataType::ListView(item) => DataType::ListView(field(item)),
        DataType::LargeListView(item) => DataType::LargeListView(field(item)),
        DataType::FixedSizeList(item, size) => DataType::FixedSizeList(field(item), *size),
        DataType::Map(entries, sorted) => DataType::Map(field(entries), *sorted),
        other => other.clone(),
    }
}

/// `data_type` as Delta stores it: strings `Utf8`, binaries `Binary`, dictionaries their
/// values, list items named `element`, and nested fields nullable (what a schema check and a
/// hash need to agree on; a table's own nullability is checked by its protocol rules).
pub fn canonical(data_type: &DataType) -> DataType {
    let field = |f: &Field, name: &str| Arc::new(Field::new(name, canonical(f.data_type()), true));
    match data_type {
        DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
        DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
        DataType::Dictionary(_, value) => canonical(value),
        DataType::List(item)
        | DataType::LargeList(item)
        | DataType::ListView(item)
        | DataType::LargeListView(item) => DataType::List(field(item, "element")),
        DataType::Struct(fields) => DataType::Struct(
            fields
                .iter()
                .map(|f| field(f, f.name()))
                .collect::<Vec<_>>()
                .into(),
        ),
        DataType::Map(entries, sorted) => {
            let DataType::Struct(kv) = entries.data_type() else {
                return data_type.clone();
            };
            let kv: Vec<Arc<Field>> = kv
                .iter()
                .enumerate()
                // A map's keys are never NULL.
                .map(|(i, f)| Arc::new(Field::new(f.name(), canonical(f.data_type()), i > 0)))
                .collect();
            DataType::Map(
                Arc::new(Field::new(
                    entries.name(),
                    DataType::Struct(kv.into()),
                    false,
                )),
                *sorted,
            )
        }
        other => other.clone(),
    }
}

/// Whether `data_type` holds anything [`canonical`] changes inside a struct, list or map.
pub fn is_nested(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::List(_)
            | DataType::LargeList(_)
            | DataType::ListView(_)
            | DataType::LargeListView(_)
            | DataType::Struct(_)
            | DataType::Map(_, _)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_flavours_are_one_type_at_every_depth() {
        let view = DataType::Struct(
            vec![
                Field::new("name", DataType::Utf8View, false),
                Field::new(
                    "tags",
                    DataType::List(Arc::new(Field::new("item", DataType::LargeUtf8, true))),
                    true,
                ),
                Field::new("raw", DataType::BinaryView, true),
            ]
            .into(),
        );
        let plain = DataType::Struct(
            vec![
                Field::new("name", DataType::Utf8, true),
                Field::new(
                    "tags",
                    DataType::List(Arc::new(Field::new("element", DataType::Utf8, true))),
                    true,
                ),
                Field::new("raw", DataType::Binary, true),
            ]
            .into(),
        );
        assert_eq!(canonical(&view), canonical(&plain));
        assert_ne!(canonical(&view), canonical(&DataType::Utf8));
        assert!(is_nested(&view) && !is_nested(&DataType::Utf8View));
    }
}

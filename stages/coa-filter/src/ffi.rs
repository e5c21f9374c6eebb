//! arrow-rs ↔ polars through the Arrow C Data Interface.
//!
//! polars 0.53 dropped its arrow-rs interop, and the two crates have their own array types, but
//! both implement the C Data Interface: `arrow::ffi::{FFI_ArrowArray, FFI_ArrowSchema}` and
//! `polars_arrow::ffi::{ArrowArray, ArrowSchema}` are the same two `#[repr(C)]` structs of the
//! specification. A column crosses by exporting it on one side, moving the struct (a bitwise move
//! transfers ownership: the release callback travels with it and runs exactly once, when the
//! importing side drops its array) and importing it on the other. No buffer is copied by the
//! interface itself; polars then converts what it stores differently (utf8 → string view,
//! list → large list).
//!
//! Only the columns an expression needs are converted (see [`crate::sql`]); results come back
//! the same way (exported at polars' oldest compat level: `large_utf8`, `large_list`), and the
//! stage applies them to its original arrow-rs batches, so outputs keep their exact types.

use anyhow::{anyhow, Context, Result};
use arrow::array::{make_array, Array, ArrayRef};
use arrow::ffi::{from_ffi, to_ffi, FFI_ArrowArray, FFI_ArrowSchema};
use polars::prelude::{CompatLevel, DataFrame, IntoColumn, Series};

// The move below relies on identical layouts; these fail to compile if that ever changes.
const _: () = assert!(std::mem::size_of::<FFI_ArrowArray>() == std::mem::size_of::<polars_arrow::ffi::ArrowArray>());
const _: () = assert!(std::mem::size_of::<FFI_ArrowSchema>() == std::mem::size_of::<polars_arrow::ffi::ArrowSchema>());
const _: () = assert!(std::mem::align_of::<FFI_ArrowArray>() == std::mem::align_of::<polars_arrow::ffi::ArrowArray>());
const _: () = assert!(std::mem::align_of::<FFI_ArrowSchema>() == std::mem::align_of::<polars_arrow::ffi::ArrowSchema>());

/// One arrow-rs array as a polars-arrow array (zero-copy).
pub fn arrow_to_polars_array(array: &dyn Array) -> Result<Box<dyn polars_arrow::array::Array>> {
    let (ffi_array, ffi_schema) = to_ffi(&array.to_data()).context("exporting an arrow-rs array to the C data interface")?;
    // SAFETY: both pairs are the C Data Interface's ArrowArray/ArrowSchema, `#[repr(C)]` with the
    // same fields (sizes asserted above). `transmute` moves the values: the arrow-rs wrappers are
    // not dropped, so each release callback runs once, from the polars side.
    let schema: polars_arrow::ffi::ArrowSchema = unsafe { std::mem::transmute::<FFI_ArrowSchema, polars_arrow::ffi::ArrowSchema>(ffi_schema) };
    let c_array: polars_arrow::ffi::ArrowArray = unsafe { std::mem::transmute::<FFI_ArrowArray, polars_arrow::ffi::ArrowArray>(ffi_array) };
    // SAFETY: the structs were just produced by arrow-rs' exporter, so they are valid.
    let field = unsafe { polars_arrow::ffi::import_field_from_c(&schema) }.map_err(|e| anyhow!("importing an arrow field into polars: {e}"))?;
    let imported = unsafe { polars_arrow::ffi::import_array_from_c(c_array, field.dtype().clone()) }
        .map_err(|e| anyhow!("importing an arrow array into polars: {e}"))?;
    Ok(imported)
}

/// One polars-arrow array as an arrow-rs array (zero-copy).
pub fn polars_array_to_arrow(array: Box<dyn polars_arrow::array::Array>) -> Result<ArrayRef> {
    let field = polars_arrow::datatypes::Field::new("".into(), array.dtype().clone(), true);
    let schema = polars_arrow::ffi::export_field_to_c(&field);
    let c_array = polars_arrow::ffi::export_array_to_c(array);
    // SAFETY: as in `arrow_to_polars_array`, in the other direction.
    let schema: FFI_ArrowSchema = unsafe { std::mem::transmute::<polars_arrow::ffi::ArrowSchema, FFI_ArrowSchema>(schema) };
    let c_array: FFI_ArrowArray = unsafe { std::mem::transmute::<polars_arrow::ffi::ArrowArray, FFI_ArrowArray>(c_array) };
    // SAFETY: produced by polars' exporter just above.
    let data = unsafe { from_ffi(c_array, &schema) }.context("importing a polars array into arrow-rs")?;
    Ok(make_array(data))
}

/// A column made of arrow-rs chunks (one per record batch) as a polars Series.
pub fn arrow_to_series(name: &str, chunks: &[ArrayRef]) -> Result<Series> {
    let arrays = chunks.iter().map(|c| arrow_to_polars_array(c.as_ref())).collect::<Result<Vec<_>>>()?;
    Series::from_arrow_chunks(name.into(), arrays).map_err(|e| anyhow!("column `{name}`: polars cannot hold it: {e}"))
}

/// A polars Series as one arrow-rs array, at polars' oldest compat level (`large_utf8`,
/// `large_list`: the encodings arrow-rs casts from most widely). Cast it to the type you need.
pub fn series_to_arrow(series: &Series) -> Result<ArrayRef> {
    let series = series.rechunk();
    if series.chunks().is_empty() {
        // A Series always has a chunk in practice; an empty one converts through an empty slice.
        let empty = Series::new_empty(series.name().clone(), series.dtype());
        return polars_array_to_arrow(empty.rechunk().to_arrow(0, CompatLevel::oldest()));
    }
    polars_array_to_arrow(series.to_arrow(0, CompatLevel::oldest()))
}

/// Builds a DataFrame of `height` rows from named arrow-rs columns (each a list of chunks).
pub fn dataframe(height: usize, columns: &[(&str, Vec<ArrayRef>)]) -> Result<DataFrame> {
    let cols = columns.iter().map(|(name, chunks)| arrow_to_series(name, chunks).map(|s| s.into_column())).collect::<Result<Vec<_>>>()?;
    DataFrame::new(height, cols).map_err(|e| anyhow!("building a polars frame: {e}"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::*;
    use arrow::buffer::{NullBuffer, OffsetBuffer};
    use arrow::compute::cast;
    use arrow::datatypes::{DataType, Field, Fields, Float32Type, Int32Type, UInt8Type};

    use super::*;

    fn list_of(item: DataType) -> DataType {
        DataType::List(Arc::new(Field::new("item", item, true)))
    }

    /// Every column type our tables use, with nulls where the type allows them.
    fn samples() -> Vec<(&'static str, ArrayRef)> {
        let utf8: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), None, Some(""), Some("ünïcode ✓")]));
        let list_utf8: ArrayRef = {
            let mut b = ListBuilder::new(StringBuilder::new());
            b.values().append_value("x");
            b.values().append_null();
            b.append(true);
            b.append(false);
            b.append(true); // empty list
            b.values().append_value("y");
            b.append(true);
            Arc::new(b.finish())
        };
        let step_fields = Fields::from(vec![
            Field::new("role", DataType::Utf8, false),
            Field::new("tool", DataType::Utf8, true),
            Field::new("n", DataType::Int32, false),
        ]);
        let structs = StructArray::new(
            step_fields.clone(),
            vec![
                Arc::new(StringArray::from(vec!["think", "tool", "answer", "plan", "think"])) as ArrayRef,
                Arc::new(StringArray::from(vec![None, Some("web_search"), None, None, Some("code")])),
                Arc::new(Int32Array::from(vec![1, 2, 3, 4, 5])),
            ],
            None,
        );
        let list_struct: ArrayRef = Arc::new(ListArray::new(
            Arc::new(Field::new("item", DataType::Struct(step_fields), true)),
            OffsetBuffer::new(vec![0, 2, 2, 5, 5].into()),
            Arc::new(structs),
            Some(NullBuffer::from(vec![true, true, true, false])),
        ));
        let list_u8: ArrayRef = Arc::new(ListArray::from_iter_primitive::<UInt8Type, _, _>(vec![
            Some(vec![Some(0u8), Some(1), Some(255)]),
            None,
            Some(vec![]),
            Some(vec![Some(7)]),
        ]));
        let list_i32: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
            Some(vec![Some(1), Some(-2)]),
            Some(vec![]),
            None,
            Some(vec![Some(i32::MAX), Some(i32::MIN)]),
        ]));
        let list_f32: ArrayRef =
            Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(vec![Some(vec![Some(-0.5f32), Some(1e-30)]), None, Some(vec![]), Some(vec![Some(3.25)])]));
        vec![
            ("utf8", utf8),
            ("list_utf8", list_utf8),
            ("list_struct", list_struct),
            ("int32", Arc::new(Int32Array::from(vec![Some(1), None, Some(-3), Some(i32::MAX)]))),
            ("int64", Arc::new(Int64Array::from(vec![Some(i64::MIN), Some(0), None, Some(42)]))),
            ("float32", Arc::new(Float32Array::from(vec![Some(0.5f32), None, Some(-1.25), Some(f32::INFINITY)]))),
            ("float64", Arc::new(Float64Array::from(vec![Some(1e300), Some(-0.0), None, Some(2.5)]))),
            ("bool", Arc::new(BooleanArray::from(vec![Some(true), Some(false), None, Some(true)]))),
            ("list_u8", list_u8),
            ("list_i32", list_i32),
            ("list_f32", list_f32),
        ]
    }

    #[test]
    fn every_column_type_round_trips_through_polars() {
        for (name, array) in samples() {
            let series = arrow_to_series(name, std::slice::from_ref(&array)).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            assert_eq!(series.len(), array.len(), "{name}");
            assert_eq!(series.null_count(), array.logical_null_count(), "{name}: nulls");
            let back = series_to_arrow(&series).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            let back = cast(&back, array.data_type()).unwrap_or_else(|e| panic!("{name}: cast back to {}: {e}", array.data_type()));
            assert_eq!(back.to_data(), array.to_data(), "{name}: round trip changed the data");
        }
    }

    #[test]
    fn sliced_and_chunked_columns_convert() {
        for (name, array) in samples() {
            // Offsets into shared buffers (a sliced batch) and several chunks (several batches).
            let (a, b) = (array.slice(1, 2), array.slice(3, 1));
            let series = arrow_to_series(name, &[a.clone(), b.clone()]).unwrap();
            assert_eq!(series.len(), 3, "{name}");
            let back = cast(&series_to_arrow(&series).unwrap(), array.data_type()).unwrap();
            let expected = arrow::compute::concat(&[a.as_ref(), b.as_ref()]).unwrap();
            assert_eq!(back.to_data(), expected.to_data(), "{name}");
        }
    }

    #[test]
    fn values_are_what_polars_sees() {
        use polars::prelude::{col, lit, IntoLazy};
        let hops: ArrayRef = Arc::new(Int32Array::from(vec![3, 7, 5]));
        let suite: ArrayRef = Arc::new(StringArray::from(vec!["math", "multihop", "multihop"]));
        let df = dataframe(3, &[("hops", vec![hops]), ("suite", vec![suite])]).unwrap();
        let out = df.lazy().filter(col("hops").gt_eq(lit(5)).and(col("suite").eq(lit("multihop")))).collect().unwrap();
        assert_eq!(out.height(), 2);
        let hops: Vec<Option<i32>> = out.column("hops").unwrap().i32().unwrap().into_iter().collect();
        assert_eq!(hops, vec![Some(7), Some(5)]);
    }

    #[test]
    fn empty_columns_convert() {
        let empty: ArrayRef = Arc::new(StringArray::from(Vec::<&str>::new()));
        let s = arrow_to_series("e", &[empty]).unwrap();
        assert_eq!(s.len(), 0);
        let back = series_to_arrow(&s).unwrap();
        assert_eq!(back.len(), 0);
        let df = dataframe(4, &[]).unwrap();
        assert_eq!(df.height(), 4);
    }

    #[test]
    fn list_of_helper_is_the_table_encoding() {
        // The tables' list type names its item field `item`, as both libraries do.
        assert_eq!(list_of(DataType::Int32), coa_schemas::tables::TOKENS.column("input_ids").unwrap().dtype);
    }
}

//! Exact content keys of rows: a 128-bit xxh3 hash of the values of some columns.
//!
//! The hash is a function of the *logical* values only (not of buffer layout, slicing, batch
//! boundaries, or the bytes arrow leaves under null slots), so the same row hashes the same in any
//! batch of any file. Each array type feeds a canonical encoding of a run of its elements into the
//! streaming hasher: one validity byte per element, then the valid elements' values (strings and
//! lists as their lengths, then their bytes / child elements). Because a streaming hash does not
//! depend on how its input is split into updates, contiguous runs are fed in bulk.
//!
//! With 128 bits, two different rows share a key with probability ~n²/2¹²⁹ (≈10⁻²⁹ for a million
//! rows): we treat equal keys as equal rows.

use anyhow::{bail, Result};
use arrow::array::{Array, AsArray, GenericByteArray, GenericListArray, OffsetSizeTrait};
use arrow::datatypes::{ArrowNativeType, ByteArrayType, DataType};
use xxhash_rust::xxh3::Xxh3;

/// Whether [`row_key`] can hash a column of this type.
pub fn supported(dt: &DataType) -> bool {
    use DataType::*;
    match dt {
        Null | Boolean | Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Float16 | Float32 | Float64 | Date32 | Date64
        | Time32(_) | Time64(_) | Timestamp(_, _) | Duration(_) | Utf8 | LargeUtf8 | Binary | LargeBinary | Utf8View | BinaryView => true,
        List(f) | LargeList(f) | FixedSizeList(f, _) => supported(f.data_type()),
        Struct(fs) => fs.iter().all(|f| supported(f.data_type())),
        _ => false,
    }
}

/// Reusable scratch space for hashing.
#[derive(Default)]
pub struct Hasher {
    scratch: Vec<u8>,
}

impl Hasher {
    /// The key of row `row` over `columns` (which must all be [`supported`]).
    pub fn row_key(&mut self, columns: &[&dyn Array], row: usize) -> Result<u128> {
        let mut h = Xxh3::new();
        for c in columns {
            self.feed(*c, &[(row, row + 1)], &mut h)?;
        }
        Ok(h.digest128())
    }

    /// Feeds the elements of `array` in `runs` (half-open index ranges) to `h`.
    fn feed(&mut self, array: &dyn Array, runs: &[(usize, usize)], h: &mut Xxh3) -> Result<()> {
        // 1. Validity: one byte per element.
        self.scratch.clear();
        let nulls = array.logical_nulls();
        for &(s, e) in runs {
            match &nulls {
                None => self.scratch.resize(self.scratch.len() + (e - s), 1),
                Some(n) => self.scratch.extend((s..e).map(|i| n.is_valid(i) as u8)),
            }
        }
        h.update(&self.scratch);
        let is_valid = |i: usize| nulls.as_ref().is_none_or(|n| n.is_valid(i));
        let all_valid = |s: usize, e: usize| nulls.as_ref().is_none_or(|n| n.slice(s, e - s).null_count() == 0);

        // 2. The valid elements' values.
        use DataType::*;
        match array.data_type() {
            Null => {}
            Boolean => {
                let a = array.as_boolean();
                self.scratch.clear();
                for &(s, e) in runs {
                    self.scratch.extend((s..e).filter(|&i| is_valid(i)).map(|i| a.value(i) as u8));
                }
                h.update(&self.scratch);
            }
            Utf8 => self.feed_bytes(array.as_string::<i32>(), runs, &is_valid, &all_valid, h),
            LargeUtf8 => self.feed_bytes(array.as_string::<i64>(), runs, &is_valid, &all_valid, h),
            Binary => self.feed_bytes(array.as_binary::<i32>(), runs, &is_valid, &all_valid, h),
            LargeBinary => self.feed_bytes(array.as_binary::<i64>(), runs, &is_valid, &all_valid, h),
            Utf8View | BinaryView => {
                let values: Vec<&[u8]> = match array.data_type() {
                    Utf8View => {
                        let a = array.as_string_view();
                        runs.iter().flat_map(|&(s, e)| s..e).filter(|&i| is_valid(i)).map(|i| a.value(i).as_bytes()).collect()
                    }
                    _ => {
                        let a = array.as_binary_view();
                        runs.iter().flat_map(|&(s, e)| s..e).filter(|&i| is_valid(i)).map(|i| a.value(i)).collect()
                    }
                };
                self.scratch.clear();
                for v in &values {
                    self.scratch.extend_from_slice(&(v.len() as u64).to_le_bytes());
                }
                h.update(&self.scratch);
                for v in values {
                    h.update(v);
                }
            }
            List(_) => self.feed_list(array.as_list::<i32>(), runs, &is_valid, h)?,
            LargeList(_) => self.feed_list(array.as_list::<i64>(), runs, &is_valid, h)?,
            FixedSizeList(_, size) => {
                let a = array.as_fixed_size_list();
                let size = *size as usize;
                let child_runs = valid_runs(runs, &is_valid).into_iter().map(|(s, e)| (s * size, e * size)).collect::<Vec<_>>();
                self.feed(a.values().as_ref(), &child_runs, h)?;
            }
            Struct(_) => {
                let a = array.as_struct();
                let child_runs = valid_runs(runs, &is_valid);
                for child in a.columns() {
                    self.feed(child.as_ref(), &child_runs, h)?;
                }
            }
            dt if dt.is_primitive() => {
                let width = dt.primitive_width().unwrap_or(0);
                let data = array.to_data();
                let buf = &data.buffers()[0];
                let bytes = &buf.as_slice()[data.offset() * width..];
                for &(s, e) in runs {
                    if all_valid(s, e) {
                        h.update(&bytes[s * width..e * width]);
                    } else {
                        for i in (s..e).filter(|&i| is_valid(i)) {
                            h.update(&bytes[i * width..(i + 1) * width]);
                        }
                    }
                }
            }
            other => bail!("cannot compare values of type {other}"),
        }
        Ok(())
    }

    fn feed_bytes<T: ByteArrayType>(
        &mut self,
        a: &GenericByteArray<T>,
        runs: &[(usize, usize)],
        is_valid: &dyn Fn(usize) -> bool,
        all_valid: &dyn Fn(usize, usize) -> bool,
        h: &mut Xxh3,
    ) {
        let offsets = a.value_offsets();
        self.scratch.clear();
        for &(s, e) in runs {
            for i in (s..e).filter(|&i| is_valid(i)) {
                let len = (offsets[i + 1] - offsets[i]).as_usize() as u64;
                self.scratch.extend_from_slice(&len.to_le_bytes());
            }
        }
        h.update(&self.scratch);
        let values = a.value_data();
        for &(s, e) in runs {
            if all_valid(s, e) {
                h.update(&values[offsets[s].as_usize()..offsets[e].as_usize()]);
            } else {
                for i in (s..e).filter(|&i| is_valid(i)) {
                    h.update(&values[offsets[i].as_usize()..offsets[i + 1].as_usize()]);
                }
            }
        }
    }

    fn feed_list<O: OffsetSizeTrait>(&mut self, a: &GenericListArray<O>, runs: &[(usize, usize)], is_valid: &dyn Fn(usize) -> bool, h: &mut Xxh3) -> Result<()> {
        let offsets = a.value_offsets();
        self.scratch.clear();
        let mut child_runs: Vec<(usize, usize)> = Vec::new();
        for &(s, e) in runs {
            for i in (s..e).filter(|&i| is_valid(i)) {
                let (cs, ce) = (offsets[i].as_usize(), offsets[i + 1].as_usize());
                self.scratch.extend_from_slice(&((ce - cs) as u64).to_le_bytes());
                match child_runs.last_mut() {
                    Some(last) if last.1 == cs => last.1 = ce,
                    _ if cs == ce => {}
                    _ => child_runs.push((cs, ce)),
                }
            }
        }
        h.update(&self.scratch);
        self.feed(a.values().as_ref(), &child_runs, h)
    }
}

/// The maximal runs of valid elements within `runs`.
fn valid_runs(runs: &[(usize, usize)], is_valid: &dyn Fn(usize) -> bool) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &(s, e) in runs {
        for i in s..e {
            if !is_valid(i) {
                continue;
            }
            match out.last_mut() {
                Some(last) if last.1 == i => last.1 = i + 1,
                _ => out.push((i, i + 1)),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::*;
    use arrow::buffer::{NullBuffer, OffsetBuffer};
    use arrow::datatypes::{Field, Fields};

    use super::*;

    fn keys(columns: &[ArrayRef]) -> Vec<u128> {
        let cols: Vec<&dyn Array> = columns.iter().map(|c| c.as_ref()).collect();
        let mut h = Hasher::default();
        (0..columns[0].len()).map(|r| h.row_key(&cols, r).unwrap()).collect()
    }

    #[test]
    fn equal_values_equal_keys_regardless_of_layout() {
        let a: ArrayRef = Arc::new(StringArray::from(vec![Some("x"), None, Some("yz"), Some("x"), None]));
        let k = keys(std::slice::from_ref(&a));
        assert_eq!(k[0], k[3]);
        assert_eq!(k[1], k[4]);
        assert_ne!(k[0], k[2]);
        assert_ne!(k[0], k[1]);
        // Another encoding and a slice of the same values hash the same.
        let large: ArrayRef = arrow::compute::cast(&a, &DataType::LargeUtf8).unwrap();
        let k2 = keys(&[large.slice(2, 3)]);
        assert_eq!(&k2[..], &k[2..]);
    }

    #[test]
    fn strings_are_length_prefixed() {
        // ("ab", "c") and ("a", "bc") must differ.
        let a: ArrayRef = Arc::new(StringArray::from(vec!["ab", "a"]));
        let b: ArrayRef = Arc::new(StringArray::from(vec!["c", "bc"]));
        let k = keys(&[a, b]);
        assert_ne!(k[0], k[1]);
        // An empty string is not a null.
        let e: ArrayRef = Arc::new(StringArray::from(vec![Some(""), None]));
        let k = keys(&[e]);
        assert_ne!(k[0], k[1]);
    }

    #[test]
    fn garbage_under_nulls_is_ignored() {
        // Null slots hold different bytes underneath; the keys must not see them.
        let ints: ArrayRef = Arc::new(Int32Array::new(vec![1, 2, 3].into(), Some(NullBuffer::from(vec![true, false, false]))));
        let k = keys(&[ints]);
        assert_eq!(k[1], k[2]);
        let strs: ArrayRef = Arc::new(StringArray::new(
            OffsetBuffer::new(vec![0, 1, 3, 6].into()),
            b"abcdef".to_vec().into(),
            Some(NullBuffer::from(vec![true, false, false])),
        ));
        let k = keys(&[strs]);
        assert_eq!(k[1], k[2]);
    }

    #[test]
    fn lists_of_structs_compare_by_content() {
        let fields = Fields::from(vec![Field::new("tool", DataType::Utf8, true), Field::new("n", DataType::Int32, false)]);
        let structs = StructArray::new(
            fields.clone(),
            vec![
                Arc::new(StringArray::from(vec![Some("s"), None, Some("s"), None, Some("s"), Some("t")])) as ArrayRef,
                Arc::new(Int32Array::from(vec![1, 2, 1, 2, 1, 2])),
            ],
            None,
        );
        // rows: [0,2) [2,4) [4,6) [6,6) null
        let list: ArrayRef = Arc::new(ListArray::new(
            Arc::new(Field::new("item", DataType::Struct(fields), true)),
            OffsetBuffer::new(vec![0, 2, 4, 6, 6, 6].into()),
            Arc::new(structs),
            Some(NullBuffer::from(vec![true, true, true, true, false])),
        ));
        let k = keys(&[list]);
        assert_eq!(k[0], k[1]);
        assert_ne!(k[0], k[2]);
        assert_ne!(k[3], k[4], "an empty list is not a null list");
    }

    #[test]
    fn several_columns_and_support() {
        let id: ArrayRef = Arc::new(StringArray::from(vec!["t1", "t1", "t2"]));
        let v: ArrayRef = Arc::new(Float32Array::from(vec![1.0, 1.0, 1.0]));
        let k = keys(&[id, v]);
        assert_eq!(k[0], k[1]);
        assert_ne!(k[0], k[2]);
        assert!(supported(&coa_schemas::tables::TRAJECTORIES.column("steps").unwrap().dtype));
        assert!(!supported(&DataType::Decimal128(10, 2)));
    }
}

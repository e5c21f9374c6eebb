//! Arrow in (`coa_text` columns) and out (`tokens` batches).

use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use arrow::array::{Array, ArrayRef, AsArray, Int32Array, ListArray, StringArray, UInt8Array};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, Int32Type, SchemaRef};
use arrow::record_batch::RecordBatch;

use crate::pack::OutRow;

/// The columns of one `coa_text` batch the stage reads.
pub struct InputBatch<'a> {
    pub task_id: &'a StringArray,
    pub prompt: &'a StringArray,
    pub text: &'a StringArray,
    spans: &'a ListArray,
    starts: &'a [i32],
    ends: &'a [i32],
}

impl<'a> InputBatch<'a> {
    pub fn new(batch: &'a RecordBatch, source: &str) -> Result<InputBatch<'a>> {
        let string = |name: &str| -> Result<&'a StringArray> {
            batch
                .column_by_name(name)
                .ok_or_else(|| anyhow!("{source}: column `{name}` is missing"))?
                .as_string_opt::<i32>()
                .ok_or_else(|| anyhow!("{source}: column `{name}` is not utf8"))
        };
        let spans = batch
            .column_by_name("observation_spans")
            .ok_or_else(|| anyhow!("{source}: column `observation_spans` is missing"))?
            .as_list_opt::<i32>()
            .ok_or_else(|| anyhow!("{source}: column `observation_spans` is not a list"))?;
        let fields = spans.values().as_struct_opt().ok_or_else(|| anyhow!("{source}: column `observation_spans` is not a list of structs"))?;
        let field = |name: &str| -> Result<&'a [i32]> {
            let col = fields.column_by_name(name).ok_or_else(|| anyhow!("{source}: column `observation_spans` has no `{name}` field"))?;
            let ints = col.as_primitive_opt::<Int32Type>().ok_or_else(|| anyhow!("{source}: `observation_spans.{name}` is not int32"))?;
            if ints.null_count() > 0 {
                return Err(anyhow!("{source}: `observation_spans.{name}` holds nulls"));
            }
            Ok(ints.values().as_ref())
        };
        let (starts, ends) = (field("start")?, field("end")?);
        Ok(InputBatch { task_id: string("task_id")?, prompt: string("prompt")?, text: string("text")?, spans, starts, ends })
    }

    pub fn len(&self) -> usize {
        self.task_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The observation spans of row `i` as (starts, ends).
    pub fn spans(&self, i: usize) -> (&'a [i32], &'a [i32]) {
        let offsets = self.spans.value_offsets();
        let (a, b) = (offsets[i] as usize, offsets[i + 1] as usize);
        (&self.starts[a..b], &self.ends[a..b])
    }
}

fn list_of(item: &Field, offsets: Vec<i32>, values: ArrayRef) -> Result<ArrayRef> {
    Ok(Arc::new(ListArray::try_new(Arc::new(item.clone()), OffsetBuffer::new(ScalarBuffer::from(offsets)), values, None)?))
}

fn item_field(schema: &SchemaRef, name: &str) -> Result<Field> {
    match schema.field_with_name(name)?.data_type() {
        DataType::List(f) => Ok(f.as_ref().clone()),
        other => Err(anyhow!("tokens schema: `{name}` is {other}, expected a list")),
    }
}

/// Builds one `tokens` batch from output rows.
pub fn build_batch(schema: &SchemaRef, rows: &[OutRow]) -> Result<RecordBatch> {
    let total: usize = rows.iter().map(|r| r.ids.len()).sum();
    let mut offsets = Vec::with_capacity(rows.len() + 1);
    offsets.push(0i32);
    let mut ids: Vec<i32> = Vec::with_capacity(total);
    let mut mask: Vec<u8> = Vec::with_capacity(total);
    let mut n_tokens = Vec::with_capacity(rows.len());
    let mut n_targets = Vec::with_capacity(rows.len());
    let packed = rows.iter().any(|r| r.segment_ids.is_some());
    let mut segs: Vec<i32> = Vec::with_capacity(if packed { total } else { 0 });
    for r in rows {
        ids.extend(r.ids.iter().map(|&x| x as i32));
        mask.extend_from_slice(&r.mask);
        if packed {
            match &r.segment_ids {
                Some(s) => segs.extend_from_slice(s),
                None => segs.resize(segs.len() + r.ids.len(), 0),
            }
        }
        let n = i32::try_from(ids.len()).context("a batch holds more than 2^31 tokens")?;
        offsets.push(n);
        n_tokens.push(r.ids.len() as i32);
        n_targets.push(r.mask.iter().map(|&m| m as i32).sum::<i32>());
    }
    let task_ids = StringArray::from_iter_values(rows.iter().map(|r| r.task_id.as_str()));
    let seg_field = item_field(schema, "segment_ids")?;
    let segment_ids: ArrayRef = if packed {
        list_of(&seg_field, offsets.clone(), Arc::new(Int32Array::from(segs)))?
    } else {
        Arc::new(ListArray::new_null(Arc::new(seg_field), rows.len()))
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(task_ids),
        list_of(&item_field(schema, "input_ids")?, offsets.clone(), Arc::new(Int32Array::from(ids)))?,
        list_of(&item_field(schema, "loss_mask")?, offsets, Arc::new(UInt8Array::from(mask)))?,
        segment_ids,
        Arc::new(Int32Array::from(n_tokens)),
        Arc::new(Int32Array::from(n_targets)),
    ];
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

//! Tables of set-aside rows: the rows a stage did not pass on, written with the input's columns
//! plus one utf8 column saying why. `coa-extract` and `coa-convert --skip-bad` name that column
//! `reject_reason`, `coa-filter --keep-dropped` names it `drop_reason`; the table is built the same
//! way for both.

use std::sync::Arc;

use anyhow::Result;
use arrow::array::{ArrayRef, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;

/// The layout of one table of set-aside rows: an input's schema plus a reason column.
#[derive(Debug, Clone)]
pub struct ReasonTable {
    column: &'static str,
    schema: SchemaRef,
}

impl ReasonTable {
    /// The table for rows of `input`: its columns and metadata, then `column` (utf8, never null).
    /// An input that already has `column` (a set-aside table read again) has it replaced, so the
    /// reason is always the last column and appears once.
    pub fn new(input: &Schema, column: &'static str) -> ReasonTable {
        let mut fields: Vec<Arc<Field>> = input.fields().iter().filter(|f| f.name() != column).cloned().collect();
        fields.push(Arc::new(Field::new(column, DataType::Utf8, false)));
        let schema = Arc::new(Schema::new(fields).with_metadata(input.metadata().clone()));
        ReasonTable { column, schema }
    }

    /// The name of the reason column.
    pub fn column(&self) -> &'static str {
        self.column
    }

    /// The schema of the table (to create its writer with).
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// `rows` (with the input's columns) and one reason per row, as a batch of the table.
    pub fn batch(&self, rows: &RecordBatch, reasons: StringArray) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for (f, c) in rows.schema().fields().iter().zip(rows.columns()) {
            if f.name() != self.column {
                columns.push(c.clone());
            }
        }
        columns.push(Arc::new(reasons));
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use arrow::array::{AsArray, Int32Array};
    use arrow::datatypes::Int32Type;

    use super::*;

    fn input(with_reason: bool) -> RecordBatch {
        let mut fields = vec![Field::new("task_id", DataType::Utf8, false)];
        let mut columns: Vec<ArrayRef> = vec![Arc::new(StringArray::from(vec!["a", "b"]))];
        if with_reason {
            fields.push(Field::new("why", DataType::Utf8, false));
            columns.push(Arc::new(StringArray::from(vec!["old", "old"])));
        }
        fields.push(Field::new("hops", DataType::Int32, true));
        columns.push(Arc::new(Int32Array::from(vec![Some(3), None])));
        let meta = HashMap::from([("coa.table".to_string(), "trajectories".to_string())]);
        RecordBatch::try_new(Arc::new(Schema::new(fields).with_metadata(meta)), columns).unwrap()
    }

    #[test]
    fn input_columns_then_one_reason_column() {
        for with_reason in [false, true] {
            let rows = input(with_reason);
            let table = ReasonTable::new(&rows.schema(), "why");
            let names: Vec<&str> = table.schema().fields().iter().map(|f| f.name().as_str()).collect();
            assert_eq!(names, ["task_id", "hops", "why"]);
            assert_eq!(table.schema().metadata(), rows.schema().metadata());
            assert!(!table.schema().field(2).is_nullable());

            let out = table.batch(&rows, StringArray::from(vec!["too short", "wrong"])).unwrap();
            assert_eq!(out.schema(), *table.schema());
            let why: Vec<&str> = out.column(2).as_string::<i32>().iter().map(|s| s.unwrap()).collect();
            assert_eq!(why, ["too short", "wrong"]);
            assert_eq!(out.column(1).as_primitive::<Int32Type>(), &Int32Array::from(vec![Some(3), None]));
        }
    }

    #[test]
    fn a_reason_per_row() {
        let rows = input(false);
        let table = ReasonTable::new(&rows.schema(), "why");
        assert!(table.batch(&rows, StringArray::from(vec!["only one"])).is_err());
    }
}

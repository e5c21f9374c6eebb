//! Shards: a deterministic 1/N of a table, by task, so one stage can run as N independent
//! processes (local or a Slurm job array) whose outputs together are the unsharded output.
//!
//! - `--shard I/N` is **0-based**: `I` in `0..N` (Slurm's `SLURM_ARRAY_TASK_ID` with
//!   `--array=0-(N-1)`). [`ShardSpec`] parses and checks it.
//! - A row belongs to shard `floor(fmix64(fnv1a64(task_id)) * N / 2^64)`: the 64-bit FNV-1a hash
//!   of the `task_id` bytes (offset 0xcbf29ce484222325, prime 0x100000001b3), mixed by
//!   MurmurHash3's 64-bit finalizer (FNV alone barely moves its high bits when only the last
//!   character differs, as in `math-train-000001`/`...002`), scaled to `0..N` by a multiply-shift.
//!   Every row of a task lands in one shard, so per-task work (GRPO groups, dedup keyed by task,
//!   per-task random streams) is the same sharded or not. In Python:
//!   `(fmix64(fnv1a64(task_id.encode())) * n) >> 64`.
//! - Cross-row steps that group by something other than the task (dedup on other columns, token
//!   packing, BPE training) cannot run per shard: their stages refuse `--shard` there and name the
//!   merge step to run first (`coa-filter --rules none -i 'shards/*.parquet' --task-order
//!   tasks.parquet`, see [`restore_task_order`]). `coa-generate policy --oversample --groups G`
//!   counts across tasks too; with `--shard` each shard draws its own share of G from its own
//!   tasks (which tasks are drawn may differ from the unsharded run, their samples do not).

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Context, Result};
use arrow::array::{Array, BooleanArray, StringArray, UInt32Array};
use arrow::compute::{cast, concat_batches, filter_record_batch, take_record_batch};
use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;

use crate::rng::{fmix64, fnv1a};

/// The column every shard key is computed from.
pub const SHARD_COLUMN: &str = "task_id";

/// One shard of N: `index` in `0..count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardSpec {
    pub index: u32,
    pub count: u32,
}

impl ShardSpec {
    /// The shard a task belongs to, of `count`.
    pub fn of(task_id: &str, count: u32) -> u32 {
        ((fmix64(fnv1a(task_id)) as u128 * count as u128) >> 64) as u32
    }

    /// Whether this shard holds `task_id`.
    pub fn holds(&self, task_id: &str) -> bool {
        Self::of(task_id, self.count) == self.index
    }

    /// The rows of `batch` this shard holds, by its `task_id` column (any string type).
    pub fn select(&self, batch: &RecordBatch, source: &str) -> Result<RecordBatch> {
        let ids = task_ids(batch, source)?;
        let mask: BooleanArray = ids.iter().map(|id| Some(id.is_some_and(|id| self.holds(id)))).collect();
        Ok(filter_record_batch(batch, &mask)?)
    }
}

impl fmt::Display for ShardSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for ShardSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<ShardSpec, String> {
        let bad = || format!("`{s}`: expected I/N with 0 <= I < N (0-based, e.g. 0/4 .. 3/4)");
        let (i, n) = s.trim().split_once('/').ok_or_else(bad)?;
        let (index, count) = match (i.trim().parse::<u32>(), n.trim().parse::<u32>()) {
            (Ok(i), Ok(n)) => (i, n),
            _ => return Err(bad()),
        };
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(ShardSpec { index, count })
    }
}

/// The `--shard` flag, flattened into the command line of every stage that works row by row.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ShardArgs {
    /// Process only shard I of N (0-based): the rows whose task_id hashes to I (64-bit FNV-1a,
    /// scaled to 0..N), so every row of a task stays in one shard. The N outputs together are the
    /// unsharded output; `coa-filter --rules none -i 'DIR/*.parquet' --task-order TASKS` merges
    /// them in the unsharded order.
    #[arg(long, value_name = "I/N", value_parser = ShardSpec::from_str)]
    pub shard: Option<ShardSpec>,
}

/// A `task_id` column as UTF-8 strings (cast from large or view strings), or a clear error.
fn task_ids(batch: &RecordBatch, source: &str) -> Result<StringArray> {
    let Some(col) = batch.column_by_name(SHARD_COLUMN) else {
        bail!("{source}: --shard needs a `{SHARD_COLUMN}` column to split rows by task; this table has none");
    };
    match col.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {}
        other => bail!("{source}: --shard splits rows by the `{SHARD_COLUMN}` column, expected a string column, found {other}"),
    }
    let utf8 = cast(col, &DataType::Utf8)?;
    Ok(utf8.as_any().downcast_ref::<StringArray>().expect("cast to Utf8").clone())
}

/// Checks that a table can be sharded (it has a string `task_id` column) before any work.
pub fn check_shardable(schema: &SchemaRef, source: &str) -> Result<()> {
    task_ids(&RecordBatch::new_empty(schema.clone()), source).map(|_| ())
}

/// The merge step of a sharded run: `batches` (the shard outputs, concatenated) reordered stably
/// to the order in which their tasks appear in `order` (the task ids of the unsharded input). Rows
/// of one task keep their relative order, so when each shard kept its input order, the result
/// is the unsharded output row for row. A row whose task is not in `order` is an error.
pub fn restore_task_order(schema: &SchemaRef, batches: &[RecordBatch], order: &[String], source: &str, order_source: &str) -> Result<RecordBatch> {
    let rank: HashMap<&str, usize> = order.iter().enumerate().rev().map(|(i, id)| (id.as_str(), i)).collect();
    let all = concat_batches(schema, batches).context("concatenating the shards")?;
    let ids = task_ids(&all, source)?;
    let mut keyed = Vec::with_capacity(all.num_rows());
    for (row, id) in ids.iter().enumerate() {
        let id = id.with_context(|| format!("{source}: row {row} has a null `{SHARD_COLUMN}`"))?;
        let Some(&r) = rank.get(id) else {
            bail!("{source}: row {row} has task_id {}, which is not in --task-order {order_source}", crate::rows::Shown(id));
        };
        keyed.push((r, row as u32));
    }
    // Stable by construction: ties (rows of one task) are ordered by their position.
    keyed.sort_unstable();
    let indices = UInt32Array::from_iter_values(keyed.into_iter().map(|(_, row)| row));
    Ok(take_record_batch(&all, &indices)?)
}

/// Shard parts merged back into the unsharded row order as a stream: a k-way merge of the
/// parts by each row's position in `order` (ties: the earlier part, then the earlier row), as
/// [`restore_task_order`] orders their concatenation, holding one batch per part instead of every
/// row. Each part must be in task order already, as every sharded stage writes it (a shard keeps
/// its tasks' order); a row out of order is an error naming the part.
pub struct TaskOrderMerge {
    parts: Vec<Part>,
    rank: HashMap<String, usize>,
    order_source: String,
    /// (rank, part) of each part's current row, smallest first.
    heap: std::collections::BinaryHeap<std::cmp::Reverse<(usize, usize)>>,
    /// Rows taken for the next output batch: (part, row in its current batch).
    taken: Vec<(usize, usize)>,
    /// Rows per output batch.
    batch_rows: usize,
    failed: bool,
}

struct Part {
    batches: Box<dyn Iterator<Item = Result<RecordBatch>>>,
    source: String,
    batch: Option<RecordBatch>,
    ranks: Vec<usize>,
    row: usize,
    /// Rows of this part before the current batch.
    before: usize,
}

impl TaskOrderMerge {
    /// `parts`: each part's batches and its name (for errors); `order`: the task ids in order.
    pub fn new(parts: Vec<(Box<dyn Iterator<Item = Result<RecordBatch>>>, String)>, order: &[String], order_source: &str, batch_rows: usize) -> Result<TaskOrderMerge> {
        let rank: HashMap<String, usize> = order.iter().enumerate().rev().map(|(i, id)| (id.clone(), i)).collect();
        let mut merge = TaskOrderMerge {
            parts: parts.into_iter().map(|(batches, source)| Part { batches, source, batch: None, ranks: Vec::new(), row: 0, before: 0 }).collect(),
            rank,
            order_source: order_source.to_string(),
            heap: Default::default(),
            taken: Vec::new(),
            batch_rows: batch_rows.max(1),
            failed: false,
        };
        for p in 0..merge.parts.len() {
            if merge.load(p)? {
                merge.heap.push(std::cmp::Reverse((merge.parts[p].ranks[0], p)));
            }
        }
        Ok(merge)
    }

    /// Reads part `p`'s next non-empty batch; false at its end.
    fn load(&mut self, p: usize) -> Result<bool> {
        let part = &mut self.parts[p];
        let last = part.ranks.last().copied();
        part.before += part.batch.as_ref().map_or(0, |b| b.num_rows());
        part.batch = None;
        while let Some(batch) = part.batches.next() {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            let ids = task_ids(&batch, &part.source)?;
            let mut ranks = Vec::with_capacity(ids.len());
            for (i, id) in ids.iter().enumerate() {
                let row = part.before + i;
                let id = id.with_context(|| format!("{}: row {row} has a null `{SHARD_COLUMN}`", part.source))?;
                let Some(&r) = self.rank.get(id) else {
                    bail!("{}: row {row} has task_id {}, which is not in --task-order {}", part.source, crate::rows::Shown(id), self.order_source);
                };
                if let Some(prev) = ranks.last().copied().or(last) {
                    if r < prev {
                        bail!(
                            "{}: row {row} (task {}) comes before the row above it in --task-order {}: a shard part must be in task order, as the sharded stages write it",
                            part.source,
                            crate::rows::Shown(id),
                            self.order_source
                        );
                    }
                }
                ranks.push(r);
            }
            part.ranks = ranks;
            part.row = 0;
            part.batch = Some(batch);
            return Ok(true);
        }
        Ok(false)
    }

    /// The rows taken so far as one batch, built from the parts' current batches.
    fn flush(&mut self) -> Result<Option<RecordBatch>> {
        if self.taken.is_empty() {
            return Ok(None);
        }
        // Every taken row lies in its part's current batch: a part moves to its next batch only
        // after a flush.
        let batches: Vec<&RecordBatch> = self.parts.iter().map(|p| p.batch.as_ref().unwrap_or_else(|| self.parts.iter().find_map(|q| q.batch.as_ref()).expect("a taken row's batch"))).collect();
        let out = arrow::compute::interleave_record_batch(&batches, &self.taken)?;
        self.taken.clear();
        Ok(Some(out))
    }

    fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        while let Some(std::cmp::Reverse((_, p))) = self.heap.pop() {
            let part = &mut self.parts[p];
            self.taken.push((p, part.row));
            part.row += 1;
            let next_rank = part.ranks.get(part.row).copied();
            match next_rank {
                Some(r) => self.heap.push(std::cmp::Reverse((r, p))),
                None => {
                    // This part's batch is used up: what was taken from it goes out first.
                    let out = self.flush()?;
                    if self.load(p)? {
                        self.heap.push(std::cmp::Reverse((self.parts[p].ranks[0], p)));
                    }
                    if out.is_some() {
                        return Ok(out);
                    }
                    continue;
                }
            }
            if self.taken.len() >= self.batch_rows {
                return self.flush();
            }
        }
        self.flush()
    }
}

impl Iterator for TaskOrderMerge {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Result<RecordBatch>> {
        if self.failed {
            return None;
        }
        let next = self.next_batch().transpose();
        if matches!(next, Some(Err(_))) {
            self.failed = true;
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow::array::Int32Array;
    use arrow::datatypes::{Field, Schema};

    /// (task_id, value) rows as a batch.
    fn rows(schema: &SchemaRef, rows: &[(&str, i32)]) -> RecordBatch {
        let ids = StringArray::from_iter_values(rows.iter().map(|r| r.0));
        let values = Int32Array::from_iter_values(rows.iter().map(|r| r.1));
        RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(values)]).unwrap()
    }

    fn merged(parts: Vec<Vec<RecordBatch>>, order: &[String], batch_rows: usize) -> Result<Vec<RecordBatch>> {
        let parts = parts
            .into_iter()
            .enumerate()
            .map(|(i, b)| (Box::new(b.into_iter().map(Ok)) as Box<dyn Iterator<Item = Result<RecordBatch>>>, format!("part-{i}")))
            .collect();
        TaskOrderMerge::new(parts, order, "tasks", batch_rows)?.collect()
    }

    #[test]
    fn the_streaming_merge_equals_the_in_memory_order_and_refuses_a_part_out_of_order() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("task_id", DataType::Utf8, false), Field::new("v", DataType::Int32, false)]));
        let order: Vec<String> = (0..40).map(|k| format!("t{k:02}")).collect();
        // 3 shards of 40 tasks, 0 to 3 rows a task, cut into batches of assorted sizes (empty
        // ones too); one shard empty.
        let mut shards: Vec<Vec<(String, i32)>> = vec![Vec::new(); 4];
        let mut v = 0;
        for (k, id) in order.iter().enumerate() {
            let s = ShardSpec::of(id, 3) as usize;
            for _ in 0..(k * 7 % 4) {
                shards[s].push((id.clone(), v));
                v += 1;
            }
        }
        let parts: Vec<Vec<RecordBatch>> = shards
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let r: Vec<(&str, i32)> = r.iter().map(|(a, b)| (a.as_str(), *b)).collect();
                let mut batches = vec![rows(&schema, &[])];
                let mut at = 0;
                for size in [1, 4, 2].iter().cycle().skip(i) {
                    if at >= r.len() {
                        break;
                    }
                    let end = (at + size).min(r.len());
                    batches.push(rows(&schema, &r[at..end]));
                    at = end;
                }
                batches
            })
            .collect();
        let all: Vec<RecordBatch> = parts.iter().flatten().cloned().collect();
        let want = restore_task_order(&schema, &all, &order, "parts", "tasks").unwrap();
        for batch_rows in [1, 3, 1000] {
            let got = merged(parts.clone(), &order, batch_rows).unwrap();
            assert!(got.iter().all(|b| b.num_rows() <= batch_rows));
            assert_eq!(concat_batches(&schema, &got).unwrap(), want, "batch_rows {batch_rows}");
        }
        assert_eq!(want.num_rows(), v as usize);

        // A part out of task order, across a batch boundary; a task not in the order.
        let swapped = vec![vec![rows(&schema, &[("t05", 0)]), rows(&schema, &[("t03", 1)])]];
        let e = merged(swapped, &order, 8).unwrap_err().to_string();
        assert!(e.contains("part-0: row 1 (task \"t03\") comes before the row above it in --task-order tasks"), "{e}");
        let e = merged(vec![vec![rows(&schema, &[("nope", 0)])]], &order, 8).unwrap_err().to_string();
        assert!(e.contains("part-0: row 0 has task_id \"nope\", which is not in --task-order tasks"), "{e}");
    }

    /// The merge's memory bound, as a property: however long the parts, it reads a part's next
    /// batch only once the rows of its current one are all out, so it holds at most one batch
    /// per part plus the output batch (peak memory measured in docs/cluster.md).
    #[test]
    fn the_merge_reads_no_part_more_than_one_batch_ahead() {
        use std::cell::RefCell;
        use std::rc::Rc;
        let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("task_id", DataType::Utf8, false), Field::new("v", DataType::Int32, false)]));
        let (n_parts, n_tasks, part_batch) = (6, 3000, 10);
        let order: Vec<String> = (0..n_tasks).map(|k| format!("t{k:05}")).collect();
        let mut shards: Vec<Vec<(String, i32)>> = vec![Vec::new(); n_parts];
        for (k, id) in order.iter().enumerate() {
            shards[ShardSpec::of(id, n_parts as u32) as usize].push((id.clone(), k as i32));
        }
        // Batches pulled from each part so far.
        let pulled = Rc::new(RefCell::new(vec![0usize; n_parts]));
        let parts: Vec<(Box<dyn Iterator<Item = Result<RecordBatch>>>, String)> = shards
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let batches: Vec<RecordBatch> = r.chunks(part_batch).map(|c| rows(&schema, &c.iter().map(|(a, b)| (a.as_str(), *b)).collect::<Vec<_>>())).collect();
                let pulled = pulled.clone();
                let counted = batches.into_iter().inspect(move |_| pulled.borrow_mut()[i] += 1).map(Ok);
                (Box::new(counted) as Box<dyn Iterator<Item = Result<RecordBatch>>>, format!("part-{i}"))
            })
            .collect();
        let mut emitted = vec![0usize; n_parts];
        let mut total = 0;
        for batch in TaskOrderMerge::new(parts, &order, "tasks", 7).unwrap() {
            let batch = batch.unwrap();
            let ids = batch.column(0).as_any().downcast_ref::<StringArray>().unwrap();
            for id in ids.iter().flatten() {
                emitted[ShardSpec::of(id, n_parts as u32) as usize] += 1;
            }
            total += batch.num_rows();
            for (part, (&out, &read)) in emitted.iter().zip(pulled.borrow().iter()).enumerate() {
                // Rows read from this part but not yet out: less than two of its batches.
                assert!(read * part_batch < out + 2 * part_batch, "part {part}: {read} batches read, {out} rows out");
            }
        }
        assert_eq!(total, n_tasks);
    }

    #[test]
    fn shard_specs_parse_zero_based_and_refuse_the_rest() {
        assert_eq!("0/4".parse::<ShardSpec>(), Ok(ShardSpec { index: 0, count: 4 }));
        assert_eq!(" 3 / 4 ".parse::<ShardSpec>(), Ok(ShardSpec { index: 3, count: 4 }));
        for bad in ["4/4", "5/4", "0/0", "-1/4", "1", "a/b", "1/4/2", "", "1.5/4"] {
            let e = bad.parse::<ShardSpec>().unwrap_err();
            assert!(e.contains("expected I/N with 0 <= I < N"), "{bad}: {e}");
        }
        assert_eq!(ShardSpec { index: 2, count: 3 }.to_string(), "2/3");
    }

    #[test]
    fn every_task_is_in_exactly_one_shard_and_shards_are_balanced() {
        let n = 4;
        let mut sizes = [0usize; 4];
        for k in 0..4000 {
            let id = format!("multihop-train-{k:06}");
            let holders: Vec<u32> = (0..n).filter(|&i| ShardSpec { index: i, count: n }.holds(&id)).collect();
            assert_eq!(holders.len(), 1, "{id}");
            sizes[holders[0] as usize] += 1;
        }
        // 1000 expected per shard; a binomial sd is ~27.
        assert!(sizes.iter().all(|&s| (880..1120).contains(&s)), "{sizes:?}");
        // Ids that differ only in their last character spread too (12 tasks over 3 shards).
        let mut small = [0usize; 3];
        for suite in ["multihop", "math", "code"] {
            for k in 0..4 {
                small[ShardSpec::of(&format!("{suite}-train-{k:06}"), 3) as usize] += 1;
            }
        }
        assert!(small.iter().all(|&s| (2..=7).contains(&s)), "{small:?}");
        // One shard is the whole table.
        assert!(ShardSpec { index: 0, count: 1 }.holds("anything"));
        // Fixed for all time (what a shard file written today holds): MurmurHash3's published
        // finalizer constants, checked on a value, and the shards of two ids.
        assert_eq!(fmix64(0), 0);
        assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
        assert_eq!(ShardSpec::of("math-train-000000", 4), ((fmix64(fnv1a("math-train-000000")) as u128 * 4) >> 64) as u32);
    }

    fn batch(ids: &[&str], vals: &[i32]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("task_id", DataType::Utf8, false), Field::new("v", DataType::Int32, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(StringArray::from(ids.to_vec())), Arc::new(Int32Array::from(vals.to_vec()))]).unwrap()
    }

    #[test]
    fn shards_then_merge_give_back_the_table_row_for_row() {
        let ids: Vec<String> = (0..50).flat_map(|k| [format!("t{k}"), format!("t{k}")]).collect();
        let refs: Vec<&str> = ids.iter().map(|s| s.as_str()).collect();
        let vals: Vec<i32> = (0..100).collect();
        let whole = batch(&refs, &vals);
        let shards: Vec<RecordBatch> = (0..3).map(|i| ShardSpec { index: i, count: 3 }.select(&whole, "t").unwrap()).collect();
        assert_eq!(shards.iter().map(|b| b.num_rows()).sum::<usize>(), 100);
        let order: Vec<String> = (0..50).map(|k| format!("t{k}")).collect();
        let merged = restore_task_order(&whole.schema(), &shards, &order, "shards", "tasks").unwrap();
        assert_eq!(merged, whole);
        let e = restore_task_order(&whole.schema(), &shards, &order[1..], "shards", "tasks.parquet").unwrap_err().to_string();
        assert!(e.contains("task_id \"t0\"") && e.contains("not in --task-order tasks.parquet"), "{e}");
    }

    #[test]
    fn a_table_without_task_ids_cannot_be_sharded() {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int32, false)]));
        let e = check_shardable(&schema, "x.parquet").unwrap_err().to_string();
        assert!(e.contains("x.parquet") && e.contains("needs a `task_id` column"), "{e}");
        let schema = Arc::new(Schema::new(vec![Field::new("task_id", DataType::Int32, false)]));
        let e = check_shardable(&schema, "x.parquet").unwrap_err().to_string();
        assert!(e.contains("expected a string column"), "{e}");
    }
}

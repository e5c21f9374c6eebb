//! The IO layer on real files: every format round-trips, provenance travels, and every kind of
//! bad input gets its own clear error.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int32Array, LargeStringArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use coa_schemas::io::{self, Format, Provenance};
use coa_schemas::rows::{self, CorpusPage, Task};
use coa_schemas::tables::{CORPUS, TASKS};

fn tasks(n: usize) -> Vec<Task> {
    (0..n)
        .map(|i| Task {
            task_id: format!("t{i}"),
            suite: "multihop".into(),
            split: "train".into(),
            source: "synthetic".into(),
            question: format!("Where was person {i} born?"),
            answers: vec![format!("City {i}")],
            tools: vec!["web_search".into(), "crawl_page".into()],
            hops: Some(2),
            ..Default::default()
        })
        .collect()
}

fn provenance() -> Provenance {
    Provenance { stage: "test".into(), version: "0".into(), args: vec!["--x".into()], seed: Some(7), inputs: vec![] }
}

fn write_tasks(path: &Path, format: Option<Format>, n: usize) {
    let batch = rows::to_batch(&tasks(n)).unwrap();
    io::write_all(Some(path), format, &TASKS.schema(), &[batch], &provenance()).unwrap();
}

fn err_of(path: &Path) -> String {
    match io::open(Some(path), &TASKS) {
        Ok(r) => match r.collect::<anyhow::Result<Vec<_>>>() {
            Ok(_) => panic!("expected an error for {}", path.display()),
            Err(e) => format!("{e:#}"),
        },
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn every_format_round_trips_with_provenance() {
    let dir = tempfile::tempdir().unwrap();
    for (name, format) in [("a.parquet", Format::Parquet), ("a.arrow", Format::IpcFile), ("a.arrows", Format::Ipc), ("a.ipc", Format::Ipc)] {
        let path = dir.path().join(name);
        write_tasks(&path, None, 100);
        let head = std::fs::read(&path).unwrap();
        assert_eq!(Format::sniff(&head), Some(format), "{name}");
        let reader = io::open(Some(&path), &TASKS).unwrap();
        assert_eq!(reader.format(), format);
        let prov = reader.provenance().expect("provenance in metadata");
        assert_eq!(prov, provenance());
        assert_eq!(reader.table_name().as_deref(), Some("tasks"));
        let batches: Vec<_> = reader.collect::<anyhow::Result<_>>().unwrap();
        let back: Vec<Task> = batches.iter().flat_map(|b| rows::from_batch::<Task>(b).unwrap()).collect();
        assert_eq!(back, tasks(100), "{name}");
        // No temporary file is left next to the output.
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().ends_with(".tmp")).collect();
        assert!(leftovers.is_empty());
    }
}

#[test]
fn format_flag_overrides_the_extension() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.parquet");
    write_tasks(&path, Some(Format::Ipc), 3);
    assert_eq!(Format::sniff(&std::fs::read(&path).unwrap()), Some(Format::Ipc));
}

#[test]
fn writing_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    for ext in ["parquet", "ipc"] {
        let a = dir.path().join(format!("a.{ext}"));
        let b = dir.path().join(format!("b.{ext}"));
        write_tasks(&a, None, 50);
        write_tasks(&b, None, 50);
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "{ext}");
    }
}

#[test]
fn an_unfinished_writer_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.parquet");
    {
        let mut w = io::create(Some(&path), None, &TASKS.schema(), &provenance()).unwrap();
        w.write(&rows::to_batch(&tasks(10)).unwrap()).unwrap();
        // dropped without finish(): the stage failed
    }
    assert!(!path.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "temporary file left behind");
}

#[test]
fn empty_input_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.parquet");
    std::fs::write(&path, b"").unwrap();
    let e = err_of(&path);
    assert!(e.contains("empty.parquet") && e.contains("input is empty") && e.contains("`tasks`"), "{e}");
}

#[test]
fn non_arrow_bytes_are_shown() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.jsonl");
    std::fs::write(&path, b"{\"question\": 1}\n").unwrap();
    let e = err_of(&path);
    assert!(e.contains("not Arrow or Parquet") && e.contains("7b 22") && e.contains("coa-generate tasks"), "{e}");
}

#[test]
fn truncated_inputs_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    // Several batches so a cut lands inside a message, after the schema.
    let path = dir.path().join("full.ipc");
    let mut w = io::create(Some(&path), None, &TASKS.schema(), &provenance()).unwrap();
    for _ in 0..4 {
        w.write(&rows::to_batch(&tasks(500)).unwrap()).unwrap();
    }
    w.finish().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.ipc");
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let e = err_of(&cut);
    assert!(e.contains("cut.ipc") && e.contains("truncated or corrupt"), "{e}");

    let pq = dir.path().join("full.parquet");
    write_tasks(&pq, None, 100);
    let bytes = std::fs::read(&pq).unwrap();
    let cut = dir.path().join("cut.parquet");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = err_of(&cut);
    assert!(e.contains("cut.parquet") && e.contains("truncated or corrupt"), "{e}");
}

fn write_raw(path: &Path, schema: Schema, columns: Vec<ArrayRef>) {
    let schema = Arc::new(schema);
    let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
    io::write_all(Some(path), None, &schema, &[batch], &Provenance::default()).unwrap();
}

#[test]
fn a_missing_column_names_column_type_and_producer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.parquet");
    let schema = Schema::new(vec![Field::new("url", DataType::Utf8, false), Field::new("title", DataType::Utf8, false)]);
    write_raw(&path, schema, vec![Arc::new(StringArray::from(vec!["u"])), Arc::new(StringArray::from(vec!["t"]))]);
    let e = match io::open(Some(&path), &CORPUS) {
        Err(e) => format!("{e:#}"),
        Ok(_) => panic!("accepted a table without `text`"),
    };
    assert!(e.contains("column `text` is missing") && e.contains("expected utf8") && e.contains("coa-generate tasks --corpus-out"), "{e}");
    assert!(e.contains("columns found: url, title"), "{e}");
}

#[test]
fn a_wrong_type_names_expected_and_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.ipc");
    let schema = Schema::new(vec![
        Field::new("url", DataType::Utf8, false),
        Field::new("title", DataType::Int32, false),
        Field::new("text", DataType::Utf8, false),
        Field::new("kind", DataType::Utf8, false),
    ]);
    let s = |v: &str| Arc::new(StringArray::from(vec![v])) as ArrayRef;
    write_raw(&path, schema, vec![s("u"), Arc::new(Int32Array::from(vec![1])), s("x"), s("entity")]);
    let e = format!("{:#}", io::open(Some(&path), &CORPUS).err().expect("accepted int32 title"));
    assert!(e.contains("column `title` has type int32, expected utf8"), "{e}");
}

#[test]
fn the_wrong_table_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.parquet");
    write_tasks(&path, None, 2);
    let e = format!("{:#}", io::open(Some(&path), &CORPUS).err().expect("read tasks as corpus"));
    assert!(e.contains("holds the `tasks` table, expected the `corpus` table"), "{e}");
}

#[test]
fn polars_encodings_are_cast_and_extra_columns_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("polars.parquet");
    // Columns reordered, large strings (as polars writes), plus a user column.
    let schema = Schema::new(vec![
        Field::new("kind", DataType::LargeUtf8, true),
        Field::new("text", DataType::LargeUtf8, true),
        Field::new("title", DataType::LargeUtf8, true),
        Field::new("url", DataType::LargeUtf8, true),
        Field::new("my_score", DataType::Int32, true),
    ]);
    let s = |v: &str| Arc::new(LargeStringArray::from(vec![v])) as ArrayRef;
    write_raw(&path, schema, vec![s("entity"), s("body"), s("T"), s("https://x"), Arc::new(Int32Array::from(vec![5]))]);
    let (schema, batches) = io::read_all(Some(&path), &CORPUS).unwrap();
    let names: Vec<_> = schema.fields().iter().map(|f| f.name().clone()).collect();
    assert_eq!(names, ["url", "title", "text", "kind", "my_score"]);
    let pages: Vec<CorpusPage> = rows::from_batch(&batches[0]).unwrap();
    assert_eq!(pages[0], CorpusPage { url: "https://x".into(), title: "T".into(), text: "body".into(), kind: "entity".into() });
}

#[test]
fn nulls_in_a_required_column_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nulls.parquet");
    let schema = Schema::new(vec![
        Field::new("url", DataType::Utf8, true),
        Field::new("title", DataType::Utf8, true),
        Field::new("text", DataType::Utf8, true),
        Field::new("kind", DataType::Utf8, true),
    ]);
    let s = |v: Option<&str>| Arc::new(StringArray::from(vec![v])) as ArrayRef;
    write_raw(&path, schema, vec![s(Some("u")), s(None), s(Some("x")), s(Some("entity"))]);
    let e = format!("{:#}", io::read_all(Some(&path), &CORPUS).err().expect("accepted a null title"));
    assert!(e.contains("nulls.parquet") && e.contains("title"), "{e}");
}

#[test]
fn ipc_streams_keep_batch_order_and_dictionary_columns() {
    use arrow::array::{DictionaryArray, Int32Array as I32};
    use arrow::datatypes::Int32Type;
    let dir = tempfile::tempdir().unwrap();
    // Batches are compressed several at a time: order must survive (11 is not a multiple of the group).
    let path = dir.path().join("many.ipc");
    let mut w = io::create(Some(&path), None, &TASKS.schema(), &provenance()).unwrap();
    for b in 0..11 {
        let mut t = tasks(3);
        t.iter_mut().for_each(|t| t.task_id = format!("b{b}-{}", t.task_id));
        w.write(&rows::to_batch(&t).unwrap()).unwrap();
    }
    assert_eq!(w.finish().unwrap(), 33);
    let (_, batches) = io::read_all(Some(&path), &TASKS).unwrap();
    let ids: Vec<String> = batches.iter().flat_map(|b| rows::from_batch::<Task>(b).unwrap()).map(|t| t.task_id).collect();
    let want: Vec<String> = (0..11).flat_map(|b| (0..3).map(move |i| format!("b{b}-t{i}"))).collect();
    assert_eq!(ids, want);

    // A dictionary column (as polars writes categoricals) goes through the sequential path.
    let path = dir.path().join("dict.ipc");
    let dict: DictionaryArray<Int32Type> = vec!["a", "b", "a"].into_iter().collect();
    let schema = Schema::new(vec![Field::new("c", dict.data_type().clone(), false), Field::new("n", DataType::Int32, false)]);
    let schema = Arc::new(schema);
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(dict), Arc::new(I32::from(vec![1, 2, 3]))]).unwrap();
    io::write_all(Some(&path), None, &schema, &[batch.clone(), batch.clone()], &Provenance::default()).unwrap();
    let reader = io::open_any(Some(&path)).unwrap();
    let back: Vec<RecordBatch> = reader.collect::<anyhow::Result<_>>().unwrap();
    assert_eq!(back.len(), 2);
    assert_eq!(back[1].column(0).as_ref(), batch.column(0).as_ref());
}

#[test]
fn a_device_output_is_written_in_place_not_replaced() {
    use std::os::unix::fs::FileTypeExt;
    let null = Path::new("/dev/null");
    assert!(std::fs::metadata(null).unwrap().file_type().is_char_device(), "/dev/null is not a device before the test");
    for format in [None, Some(Format::Parquet), Some(Format::IpcFile)] {
        write_tasks(null, format, 5);
        assert!(std::fs::metadata(null).unwrap().file_type().is_char_device(), "writing {format:?} replaced /dev/null");
    }
}

fn runs(n: usize) -> Vec<rows::MasRun> {
    use rows::{ChatMessage, Event, MasRun};
    (0..n)
        .map(|i| MasRun {
            task_id: format!("t{i}"),
            suite: "multihop".into(),
            question: "q".into(),
            answers: vec!["a".into()],
            backend: "scripted".into(),
            simulator: true,
            events: (0..3)
                .map(|s| Event {
                    seq: s,
                    agent: "planner".into(),
                    role: "plan".into(),
                    input_messages: vec![ChatMessage::system("you plan"), ChatMessage::user(format!("run {i} step {s}"))],
                    output: format!("<plan>{i}.{s}</plan>"),
                    observation: (s == 1).then(|| "seen".to_string()),
                    tokens_in: 10,
                    ..Default::default()
                })
                .collect(),
            success: i % 2 == 0,
            ..Default::default()
        })
        .collect()
}

#[test]
fn an_omitted_nested_field_is_never_read_and_the_rest_is_intact() {
    use arrow::array::AsArray;
    use coa_schemas::tables::MAS_RUNS;
    let dir = tempfile::tempdir().unwrap();
    let batch = rows::to_batch(&runs(50)).unwrap();
    for name in ["r.parquet", "r.arrow", "r.ipc"] {
        let path = dir.path().join(name);
        io::write_all(Some(&path), None, &MAS_RUNS.schema(), &[batch.clone()], &provenance()).unwrap();
        let reader = io::open_without(Some(&path), &MAS_RUNS, &["events.input_messages"]).unwrap();
        assert!(reader.provenance().is_some(), "{name}: metadata survives the projection");
        let schema = reader.schema();
        let DataType::List(item) = schema.field_with_name("events").unwrap().data_type() else { panic!("events is a list") };
        let DataType::Struct(fields) = item.data_type() else { panic!("events items are structs") };
        let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
        assert!(!names.contains(&"input_messages"), "{name}: {names:?}");
        assert!(names.contains(&"output") && names.contains(&"observation"), "{name}: {names:?}");
        let batches: Vec<RecordBatch> = reader.collect::<anyhow::Result<_>>().unwrap();
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert_eq!(rows, 50, "{name}");
        let events = batches[0].column_by_name("events").unwrap().as_list::<i32>();
        assert_eq!(events.values().len(), 150, "{name}: every event is kept");
        let output = events.values().as_struct().column_by_name("output").unwrap().as_string::<i32>();
        assert_eq!(output.value(4), "<plan>1.1</plan>", "{name}");
        assert_eq!(batches[0].schema().fields(), schema.fields(), "{name}: batches match the reader's schema");
    }
    // Only nested fields of the table can be omitted.
    let path = dir.path().join("r.parquet");
    for bad in ["events.nope", "nope.x", "task_id"] {
        let e = io::open_without(Some(&path), &MAS_RUNS, &[bad]).err().expect("an error");
        assert!(format!("{e:#}").contains(bad), "{bad}: {e:#}");
    }
}

/// The naming rule of `Format::for_path` in the examples: a file that `tee` or `>` makes from a
/// stage's stdout holds an IPC stream, so it is named `*.arrows`, never `*.arrow` (an IPC file,
/// which `pl.read_ipc` expects and a stream is not).
#[test]
fn files_made_from_a_pipe_are_named_arrows_in_the_examples() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("README.md"), root.join("docs/ARCHITECTURE.md")];
    for dir in ["pipelines", "stages", "docs"] {
        let mut stack = vec![root.join(dir)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() && !p.ends_with("target") {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "mk" || x == "rs" || x == "md") {
                    files.push(p);
                }
            }
        }
    }
    let mut wrong = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            for marker in ["tee ", "> "] {
                for (at, _) in line.match_indices(marker) {
                    let target = line[at + marker.len()..].split_whitespace().next().unwrap_or("");
                    if target.trim_end_matches(['\\', '"', '`', ';', ')']).ends_with(".arrow") {
                        wrong.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(files.len() > 20, "found the sources ({})", files.len());
    assert!(wrong.is_empty(), "a file made from a pipe holds an IPC stream: name it *.arrows\n{}", wrong.join("\n"));
}

#[test]
fn a_string_that_is_not_utf8_names_its_column() {
    // Written uncompressed by arrow's and parquet's own writers, then one string's first byte
    // made 0xff: the decoders' UTF-8 checks refuse it, and the error names the column.
    let schema = Arc::new(Schema::new(vec![Field::new("ok", DataType::Utf8, false), Field::new("bad", DataType::Utf8, false)]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(vec!["fine", "also fine"])), Arc::new(StringArray::from(vec!["MARKER-0123456789", "x"]))]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut written: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut buf = Vec::new();
    let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut buf, &schema).unwrap();
    w.write(&batch).unwrap();
    w.finish().unwrap();
    drop(w);
    written.push(("t.arrows", buf));
    let mut buf = Vec::new();
    let mut w = arrow::ipc::writer::FileWriter::try_new(&mut buf, &schema).unwrap();
    w.write(&batch).unwrap();
    w.finish().unwrap();
    drop(w);
    written.push(("t.arrow", buf));
    let mut buf = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut buf, schema.clone(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    written.push(("t.parquet", buf));
    for (name, mut bytes) in written {
        let marker = b"MARKER-0123456789";
        let mut hits = 0;
        for at in 0..bytes.len() - marker.len() {
            if &bytes[at..at + marker.len()] == marker {
                bytes[at] = 0xff;
                hits += 1;
            }
        }
        assert!(hits > 0, "{name}: the marker is not in the written bytes");
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        let e = match io::open_any(Some(&path)) {
            Ok(r) => r.collect::<anyhow::Result<Vec<_>>>().err().map(|e| format!("{e:#}")).unwrap_or_default(),
            Err(e) => format!("{e:#}"),
        };
        assert!(e.contains(name) && e.contains("column `bad` holds a string that is not valid UTF-8"), "{name}: {e}");
        // Read from memory (a pipe buffered whole), the column is named too.
        let e = match io::open_bytes(name, bytes::Bytes::from(bytes), None) {
            Ok(r) => r.collect::<anyhow::Result<Vec<_>>>().err().map(|e| format!("{e:#}")).unwrap_or_default(),
            Err(e) => format!("{e:#}"),
        };
        assert!(e.contains("column `bad` holds a string that is not valid UTF-8"), "{name} from memory: {e}");
    }
}

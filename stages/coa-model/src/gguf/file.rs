//! The GGUF container, read and written: header, metadata, tensor infos and the data section.
//!
//! Layout (GGUF v2 and v3, little-endian; v1 used 32-bit counts and is refused):
//!
//! ```text
//! "GGUF"  u32 version  u64 tensor_count  u64 kv_count
//! kv_count × (string key, u32 value type, value)        string = u64 byte length + UTF-8
//! tensor_count × (string name, u32 n_dims, n_dims × u64 dims, u32 ggml type, u64 offset)
//! padding to `general.alignment` (default 32)
//! data section: each tensor at its offset (relative to the section start)
//! ```
//!
//! Dims are ggml's `ne`: `dims[0]` is the fastest-varying (the row length), so an HF weight of
//! shape `[out, in]` is stored with dims `[in, out]`. Every read is bounds-checked, so a truncated
//! or corrupt file gets an error naming the file, what was being read and where, never a panic.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::dequant;

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";

/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// One metadata value, with the type the file gave it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// The GGUF type id (`gguf_type` in ggml's gguf.h).
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    /// The type's name as gguf-py spells it (for messages).
    pub fn type_name(&self) -> &'static str {
        TYPE_NAMES[self.type_id() as usize]
    }

    /// Any integer type holding a value >= 0.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(x) => Some(x.into()),
            Value::U16(x) => Some(x.into()),
            Value::U32(x) => Some(x.into()),
            Value::U64(x) => Some(x),
            Value::I8(x) => u64::try_from(x).ok(),
            Value::I16(x) => u64::try_from(x).ok(),
            Value::I32(x) => u64::try_from(x).ok(),
            Value::I64(x) => u64::try_from(x).ok(),
            _ => None,
        }
    }

    /// Any integer type (an unsigned one when it fits).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(x) => Some(x.into()),
            Value::I16(x) => Some(x.into()),
            Value::I32(x) => Some(x.into()),
            Value::I64(x) => Some(x),
            _ => self.as_u64().and_then(|x| i64::try_from(x).ok()),
        }
    }

    /// A float, widened to f64 exactly (an f32 `1e-5` reads as 9.999999747378752e-06, as in
    /// gguf-py and HF's config).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(x) => Some(x.into()),
            Value::F64(x) => Some(x),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

const TYPE_NAMES: [&str; 13] = [
    "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING", "ARRAY", "UINT64", "INT64",
    "FLOAT64",
];

/// A tensor's element type: ggml's `enum ggml_type` id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

/// Every ggml type id in use: (id, name, elements per block, bytes per block) (gguf-py's
/// `GGML_QUANT_SIZES`). Ids 4, 5, 31-33 and 36-38 were removed from ggml and are unknown here.
const GGML_TYPES: [(u32, &str, u64, u64); 34] = [
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
];

impl GgmlType {
    pub const F32: GgmlType = GgmlType(0);
    pub const F16: GgmlType = GgmlType(1);
    pub const Q4_0: GgmlType = GgmlType(2);
    pub const Q4_1: GgmlType = GgmlType(3);
    pub const Q5_0: GgmlType = GgmlType(6);
    pub const Q5_1: GgmlType = GgmlType(7);
    pub const Q8_0: GgmlType = GgmlType(8);
    pub const Q4_K: GgmlType = GgmlType(12);
    pub const Q5_K: GgmlType = GgmlType(13);
    pub const Q6_K: GgmlType = GgmlType(14);
    pub const BF16: GgmlType = GgmlType(30);

    fn entry(self) -> Option<&'static (u32, &'static str, u64, u64)> {
        GGML_TYPES.iter().find(|t| t.0 == self.0)
    }

    /// ggml's name ("Q4_1"), or None for an id ggml does not define.
    pub fn name(self) -> Option<&'static str> {
        self.entry().map(|t| t.1)
    }

    /// (elements per block, bytes per block); None for an unknown id.
    pub fn block(self) -> Option<(u64, u64)> {
        self.entry().map(|t| (t.2, t.3))
    }

    /// Whether [`dequant::to_f32`] reads this type.
    pub fn is_supported(self) -> bool {
        dequant::SUPPORTED.contains(&self)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} (ggml type {})", self.0),
            None => write!(f, "unknown ggml type {}", self.0),
        }
    }
}

/// One entry of the tensor-info table.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length. The HF shape is these reversed.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Byte offset of the data from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Row-major (HF / PyTorch) shape: the dims reversed.
    pub fn hf_shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Bytes of data; None for an unknown type.
    pub fn n_bytes(&self) -> Option<u64> {
        let (block_elems, block_bytes) = self.ggml_type.block()?;
        Some(self.n_elements() / block_elems * block_bytes)
    }
}

/// An open GGUF file: the parsed header, metadata and tensor table over the memory-mapped bytes.
pub struct GgufFile {
    path: PathBuf,
    bytes: memmap2::Mmap,
    /// 2 or 3.
    pub version: u32,
    /// Every key-value pair, in file order.
    pub metadata: Vec<(String, Value)>,
    /// Every tensor info, in file order.
    pub tensors: Vec<TensorInfo>,
    /// `general.alignment`, or 32.
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_start: u64,
    key_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// A bounds-checked little-endian cursor over the file's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    /// The next `n` bytes; `what` names the field for the truncation message.
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let left = (self.bytes.len() - self.pos) as u64;
        if n > left {
            bail!(
                "{}: truncated GGUF file: {} needs {n} bytes at offset {}, but the file ends at {}",
                self.path.display(),
                what(),
                self.pos,
                self.bytes.len()
            );
        }
        let s = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        Ok(self.take(N as u64, what)?.try_into().expect("take returns N bytes"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.u64(&|| format!("{} (length)", what()))?;
        let at = self.pos;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => bail!("{}: {} at offset {at} is not valid UTF-8 ({e})", self.path.display(), what()),
        }
    }

    /// A value of GGUF type `ty`; arrays recurse (an array of arrays is legal).
    fn value(&mut self, ty: u32, what: &dyn Fn() -> String) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            1 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => {
                let [b] = self.array(what)?;
                match b {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    other => bail!("{}: {} is a BOOL of value {other} (expected 0 or 1)", self.path.display(), what()),
                }
            }
            8 => Value::String(self.string(what)?),
            9 => {
                let elem = self.u32(&|| format!("{} (array element type)", what()))?;
                let count = self.u64(&|| format!("{} (array length)", what()))?;
                // Every element takes at least one byte: a count beyond the bytes left is a
                // truncated (or corrupt) file, caught before allocating for it.
                let left = (self.bytes.len() - self.pos) as u64;
                if count > left {
                    bail!(
                        "{}: truncated GGUF file: {} is an array of {count} elements at offset {}, but only {left} bytes follow",
                        self.path.display(),
                        what(),
                        self.pos
                    );
                }
                let mut items = Vec::with_capacity(count as usize);
                for i in 0..count {
                    items.push(self.value(elem, &|| format!("{} element {i}", what()))?);
                }
                Value::Array(items)
            }
            10 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            other => bail!("{}: {} has value type {other}, not a GGUF type (0-12)", self.path.display(), what()),
        })
    }
}

impl GgufFile {
    /// Open and parse `path` (the tensor data stays mapped, read on demand).
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = File::open(path).with_context(|| format!("opening GGUF file {}", path.display()))?;
        let len = file.metadata().with_context(|| format!("reading {}", path.display()))?.len();
        if len < 4 {
            bail!("{}: truncated GGUF file: {len} bytes, not even the 4-byte magic \"GGUF\"", path.display());
        }
        // SAFETY: the map is read-only; like every mmap reader (safetensors, llama.cpp), we rely on
        // the file not being truncated by another process while it is open.
        let bytes =
            unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("memory-mapping {}", path.display()))?;
        Self::parse(path, bytes)
    }

    fn parse(path: &Path, bytes: memmap2::Mmap) -> Result<GgufFile> {
        let mut c = Cursor { bytes: &bytes, pos: 0, path };
        let magic = c.array::<4>(&|| "the magic".into())?;
        if magic != MAGIC {
            bail!(
                "{}: not a GGUF file: it starts with {:?}, expected the magic \"GGUF\"",
                path.display(),
                String::from_utf8_lossy(&magic)
            );
        }
        let version = c.u32(&|| "the version".into())?;
        match version {
            2 | 3 => {}
            1 => bail!("{}: GGUF version 1 is not supported (expected version 2 or 3; re-convert the model with a current llama.cpp)", path.display()),
            v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
                bail!("{}: big-endian GGUF files are not supported (expected a little-endian GGUF, version 2 or 3)", path.display())
            }
            v => bail!("{}: unknown GGUF version {v} (expected 2 or 3)", path.display()),
        }
        let n_tensors = c.u64(&|| "the tensor count".into())?;
        let n_kv = c.u64(&|| "the metadata count".into())?;

        let mut metadata = Vec::new();
        let mut key_index = HashMap::new();
        for i in 0..n_kv {
            let key = c.string(&|| format!("metadata key #{i}"))?;
            let ty = c.u32(&|| format!("the type of metadata `{key}`"))?;
            let value = c.value(ty, &|| format!("metadata `{key}`"))?;
            if key_index.insert(key.clone(), metadata.len()).is_some() {
                bail!("{}: metadata key `{key}` appears twice", path.display());
            }
            metadata.push((key, value));
        }

        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => bail!("{}: metadata `general.alignment` = {v:?}; expected a power of two", path.display()),
            },
        };

        let mut tensors = Vec::new();
        let mut tensor_index = HashMap::new();
        for i in 0..n_tensors {
            let name = c.string(&|| format!("tensor info #{i} (name)"))?;
            let n_dims = c.u32(&|| format!("tensor info `{name}` (dimension count)"))?;
            if !(1..=4).contains(&n_dims) {
                bail!("{}: tensor `{name}` has {n_dims} dimensions (ggml allows 1 to 4)", path.display());
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                dims.push(c.u64(&|| format!("tensor info `{name}` (dimension {d})"))?);
            }
            let ggml_type = GgmlType(c.u32(&|| format!("tensor info `{name}` (type)"))?);
            let offset = c.u64(&|| format!("tensor info `{name}` (offset)"))?;
            if dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).is_none() {
                bail!("{}: tensor `{name}` dims {dims:?} overflow", path.display());
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                bail!("{}: tensor `{name}` appears twice", path.display());
            }
            tensors.push(TensorInfo { name, dims, ggml_type, offset });
        }

        let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
        let file_len = bytes.len() as u64;
        if !tensors.is_empty() && data_start > file_len {
            bail!(
                "{}: truncated GGUF file: the data section should start at offset {data_start}, but the file ends at {file_len}",
                path.display()
            );
        }
        let data_len = file_len.saturating_sub(data_start);
        for t in &tensors {
            let Some((block_elems, _)) = t.ggml_type.block() else { continue };
            if t.dims[0] % block_elems != 0 {
                bail!(
                    "{}: tensor `{}` ({}) has rows of {} elements, not a multiple of its block of {block_elems}",
                    path.display(),
                    t.name,
                    t.ggml_type,
                    t.dims[0]
                );
            }
            let n = t.n_bytes().expect("known type");
            if t.offset.checked_add(n).is_none_or(|end| end > data_len) {
                bail!(
                    "{}: truncated GGUF file: tensor `{}` ({}, dims {:?}) needs bytes {}..{} of the data section, which has {data_len}",
                    path.display(),
                    t.name,
                    t.ggml_type,
                    t.dims,
                    t.offset,
                    t.offset.saturating_add(n)
                );
            }
        }
        Ok(GgufFile {
            path: path.to_path_buf(),
            bytes,
            version,
            metadata,
            tensors,
            alignment,
            data_start,
            key_index,
            tensor_index,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The metadata value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// A string value; an error naming the file and key if it is there with another type.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        self.typed(key, "a STRING", Value::as_str)
    }

    /// An unsigned integer value (any integer type holding a value >= 0).
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, "a non-negative integer", Value::as_u64)
    }

    /// A float value (FLOAT32 or FLOAT64).
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        self.typed(key, "a FLOAT32 or FLOAT64", Value::as_f64)
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "a BOOL", Value::as_bool)
    }

    /// An array value.
    pub fn get_array(&self, key: &str) -> Result<Option<&[Value]>> {
        self.typed(key, "an ARRAY", Value::as_array)
    }

    /// A required unsigned integer.
    pub fn req_u64(&self, key: &str) -> Result<u64> {
        self.get_u64(key)?.with_context(|| format!("{}: metadata `{key}` is missing", self.path.display()))
    }

    fn typed<'a, T>(&'a self, key: &str, expected: &str, f: impl Fn(&'a Value) -> Option<T>) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match f(v) {
                Some(x) => Ok(Some(x)),
                None => bail!(
                    "{}: metadata `{key}` is {} {}, expected {expected}",
                    self.path.display(),
                    v.type_name(),
                    short(v)
                ),
            },
        }
    }

    /// The tensor info of `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor of a known type (bounds were checked on open).
    pub fn tensor_bytes(&self, t: &TensorInfo) -> Result<&[u8]> {
        let Some(n) = t.n_bytes() else {
            bail!("{}: tensor `{}` has {}; cannot size its data", self.path.display(), t.name, t.ggml_type);
        };
        let start = (self.data_start + t.offset) as usize;
        Ok(&self.bytes[start..start + n as usize])
    }

    /// A tensor's values as f32, in file order (row-major over the HF shape). The types of
    /// [`dequant::SUPPORTED`] are dequantized exactly as gguf-py does; any other type is an error
    /// naming the file, the tensor and its type.
    pub fn tensor_f32(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        if !t.ggml_type.is_supported() {
            bail!(
                "{}: tensor `{}` has type {}; only {} can be read (re-quantize the model to one of them, e.g. Q8_0)",
                self.path.display(),
                t.name,
                t.ggml_type,
                dequant::SUPPORTED.iter().map(|t| t.name().expect("known")).collect::<Vec<_>>().join(", ")
            );
        }
        let bytes = self.tensor_bytes(t)?;
        Ok(dequant::to_f32(t.ggml_type, bytes).expect("supported type"))
    }
}

/// A short rendering of a value for messages (arrays by length).
fn short(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("of {} elements", a.len()),
        Value::String(s) if s.chars().count() > 60 => format!("{:?}…", s.chars().take(60).collect::<String>()),
        Value::String(s) => format!("{s:?}"),
        other => format!("{other:?}"),
    }
}

/// Builds a GGUF v3 file: metadata and tensors with their raw data. For tests and tools (a tiny
/// model for a stage's test) and for the export ([`super::export::save`]).
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(TensorInfo, Vec<u8>)>,
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Adds (or replaces) a metadata entry.
    pub fn kv(&mut self, key: &str, value: Value) -> &mut Self {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key.to_string(), value)),
        }
        self
    }

    /// Adds a tensor with dims in ggml order and its data already encoded as `ggml_type`.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ggml_type: GgmlType, data: Vec<u8>) -> &mut Self {
        let info = TensorInfo { name: name.to_string(), dims: dims.to_vec(), ggml_type, offset: 0 };
        self.tensors.push((info, data));
        self
    }

    /// Adds an F32 tensor given its HF (row-major) shape.
    pub fn tensor_f32(&mut self, name: &str, hf_shape: &[usize], data: &[f32]) -> &mut Self {
        let dims: Vec<u64> = hf_shape.iter().rev().map(|&d| d as u64).collect();
        self.tensor(name, &dims, GgmlType::F32, data.iter().flat_map(|x| x.to_le_bytes()).collect())
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let alignment = self
            .metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .unwrap_or(DEFAULT_ALIGNMENT);
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_string(&mut out, k);
            out.extend_from_slice(&v.type_id().to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        for (t, data) in &self.tensors {
            put_string(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.0.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + data.len() as u64).div_ceil(alignment) * alignment;
        }
        for (_, data) in &self.tensors {
            out.resize((out.len() as u64).div_ceil(alignment) as usize * alignment as usize, 0);
            out.extend_from_slice(data);
        }
        out
    }

    /// Writes the file (through a temporary name, then renamed).
    pub fn write(&self, path: &Path) -> Result<()> {
        coa_schemas::output::write_atomically_now(path, &self.to_bytes())
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(b) => out.push(u8::from(*b)),
        Value::String(s) => put_string(out, s),
        Value::Array(items) => {
            // An empty array's element type is not recoverable from the items: UINT8, like gguf-py.
            let elem = items.first().map_or(0, Value::type_id);
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

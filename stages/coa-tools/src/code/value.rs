//! Plain Python values that crossed out of a sandbox (encoded by `plain.py`), and Python's `==`,
//! truthiness and numbers on them, so that a grader compares a program's results with the
//! expected values in its own process. Decoding is strict: anything but the encoding `plain.py`
//! writes is an error, never a value.

use anyhow::{anyhow, bail, Result};
use serde_json::Value as Json;
use coa_schemas::text::shorten;

/// None, bool, int, float, str, bytes, and lists, tuples, sets (frozensets) and dicts of these.
#[derive(Debug, Clone, PartialEq)]
pub enum PyValue {
    None,
    Bool(bool),
    /// Canonical decimal: no leading zeros, `-` only before a non-zero value.
    Int(String),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<PyValue>),
    Tuple(Vec<PyValue>),
    Set(Vec<PyValue>),
    /// In the order the program's dict had.
    Dict(Vec<(PyValue, PyValue)>),
}

/// A form in which Python's `==` is structural equality: equal numbers of any type (`True`,
/// `1`, `1.0`) become the same integer, sets and dicts are sorted. `None` for a value holding a
/// NaN, which equals nothing (two values from two processes are never the same object).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    None,
    Int(String),
    /// A finite or infinite non-integral float, by its bits.
    Float(u64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Key>),
    Tuple(Vec<Key>),
    Set(Vec<Key>),
    Dict(Vec<(Key, Key)>),
}

/// Canonical decimal of an integer literal, or `None`.
fn canonical_int(s: &str) -> Option<String> {
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = digits.trim_start_matches('0');
    Some(match (digits.is_empty(), neg) {
        (true, _) => "0".to_string(),
        (false, true) => format!("-{digits}"),
        (false, false) => digits.to_string(),
    })
}

impl PyValue {
    /// Decodes `plain.py`'s JSON.
    pub fn from_json(j: &Json) -> Result<PyValue> {
        Ok(match j {
            Json::Null => PyValue::None,
            Json::Bool(b) => PyValue::Bool(*b),
            Json::Object(m) if m.len() == 1 => {
                let (tag, x) = m.iter().next().expect("one entry");
                let items = || -> Result<Vec<PyValue>> {
                    x.as_array().ok_or_else(|| anyhow!("`{tag}` must hold a list"))?.iter().map(PyValue::from_json).collect()
                };
                match (tag.as_str(), x) {
                    ("i", Json::String(s)) => PyValue::Int(canonical_int(s).ok_or_else(|| anyhow!("bad int {s:?}"))?),
                    ("f", Json::String(s)) => PyValue::Float(s.parse().map_err(|_| anyhow!("bad float {s:?}"))?),
                    ("u", Json::String(s)) => PyValue::Str(hex_bytes(s).and_then(|b| String::from_utf8(b).ok()).ok_or_else(|| anyhow!("bad str {}", shorten(s, 80)))?),
                    ("b", Json::String(s)) => PyValue::Bytes(hex_bytes(s).ok_or_else(|| anyhow!("bad bytes {}", shorten(s, 80)))?),
                    ("l", _) => PyValue::List(items()?),
                    ("t", _) => PyValue::Tuple(items()?),
                    ("s", _) => PyValue::Set(items()?),
                    ("d", Json::Array(pairs)) => PyValue::Dict(
                        pairs
                            .iter()
                            .map(|p| match p.as_array().map(Vec::as_slice) {
                                Some([k, v]) => Ok((PyValue::from_json(k)?, PyValue::from_json(v)?)),
                                _ => bail!("a dict entry must be [key, value]"),
                            })
                            .collect::<Result<_>>()?,
                    ),
                    _ => bail!("unknown encoded value {j}"),
                }
            }
            _ => bail!("not an encoded plain value: {}", shorten(&j.to_string(), 80)),
        })
    }

    /// Python's `self == other` for two objects of separate processes.
    pub fn py_eq(&self, other: &PyValue) -> bool {
        matches!((self.key(), other.key()), (Some(a), Some(b)) if a == b)
    }

    /// Python's `bool(self)`.
    pub fn truthy(&self) -> bool {
        match self {
            PyValue::None => false,
            PyValue::Bool(b) => *b,
            PyValue::Int(s) => s != "0",
            PyValue::Float(f) => *f != 0.0,
            PyValue::Str(s) => !s.is_empty(),
            PyValue::Bytes(b) => !b.is_empty(),
            PyValue::List(v) | PyValue::Tuple(v) | PyValue::Set(v) => !v.is_empty(),
            PyValue::Dict(v) => !v.is_empty(),
        }
    }

    /// The number, for bool, int and float (a huge int is ±inf, as `float()` would not say).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            PyValue::Bool(b) => Some(f64::from(u8::from(*b))),
            PyValue::Int(s) => s.parse().ok(),
            PyValue::Float(f) => Some(*f),
            _ => None,
        }
    }

    fn key(&self) -> Option<Key> {
        let all = |v: &[PyValue]| v.iter().map(PyValue::key).collect::<Option<Vec<Key>>>();
        Some(match self {
            PyValue::None => Key::None,
            PyValue::Bool(b) => Key::Int(if *b { "1" } else { "0" }.to_string()),
            PyValue::Int(s) => Key::Int(s.clone()),
            PyValue::Float(f) if f.is_nan() => return None,
            // Rust prints an integral float's exact decimal expansion: 1e300 as 301 digits.
            PyValue::Float(f) if f.is_finite() && f.fract() == 0.0 => Key::Int(canonical_int(&format!("{f:.0}")).expect("digits")),
            PyValue::Float(f) => Key::Float(f.to_bits()),
            PyValue::Str(s) => Key::Str(s.clone()),
            PyValue::Bytes(b) => Key::Bytes(b.clone()),
            PyValue::List(v) => Key::List(all(v)?),
            PyValue::Tuple(v) => Key::Tuple(all(v)?),
            PyValue::Set(v) => {
                let mut keys = all(v)?;
                keys.sort();
                Key::Set(keys)
            }
            PyValue::Dict(v) => {
                let mut pairs = v.iter().map(|(k, x)| Some((k.key()?, x.key()?))).collect::<Option<Vec<_>>>()?;
                pairs.sort();
                Key::Dict(pairs)
            }
        })
    }

    /// Python's `repr`, cut to about `max` characters, for failure messages.
    pub fn repr(&self, max: usize) -> String {
        let mut out = String::new();
        self.write_repr(&mut out, max);
        if out.len() > max {
            let cut = (0..=max).rev().find(|&i| out.is_char_boundary(i)).unwrap_or(0);
            out.truncate(cut);
            out.push_str("...");
        }
        out
    }

    fn write_repr(&self, out: &mut String, max: usize) {
        if out.len() > max {
            return;
        }
        let seq = |out: &mut String, items: &[PyValue], open: &str, close: &str| {
            out.push_str(open);
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                x.write_repr(out, max);
            }
            if open == "(" && items.len() == 1 {
                out.push(',');
            }
            out.push_str(close);
        };
        match self {
            PyValue::None => out.push_str("None"),
            PyValue::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
            PyValue::Int(s) => out.push_str(s),
            PyValue::Float(f) if f.is_nan() => out.push_str("nan"),
            PyValue::Float(f) if f.is_infinite() => out.push_str(if *f > 0.0 { "inf" } else { "-inf" }),
            PyValue::Float(f) => out.push_str(&format!("{f:?}")),
            PyValue::Str(s) => out.push_str(&format!("{s:?}")),
            PyValue::Bytes(b) => out.push_str(&format!("b{:?}", String::from_utf8_lossy(b))),
            PyValue::List(v) => seq(out, v, "[", "]"),
            PyValue::Tuple(v) => seq(out, v, "(", ")"),
            PyValue::Set(v) if v.is_empty() => out.push_str("set()"),
            PyValue::Set(v) => seq(out, v, "{", "}"),
            PyValue::Dict(v) => {
                out.push('{');
                for (i, (k, x)) in v.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    k.write_repr(out, max);
                    out.push_str(": ");
                    x.write_repr(out, max);
                }
                out.push('}');
            }
        }
    }
}

fn hex_bytes(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(json: &str) -> PyValue {
        PyValue::from_json(&serde_json::from_str(json).unwrap()).unwrap()
    }

    #[test]
    fn equality_is_pythons() {
        let (one, one_f, t) = (v(r#"{"i": "1"}"#), v(r#"{"f": "1.0"}"#), v("true"));
        assert!(one.py_eq(&one_f) && one.py_eq(&t) && t.py_eq(&one_f), "1 == 1.0 == True");
        assert!(v(r#"{"i": "-0"}"#).py_eq(&v(r#"{"f": "-0.0"}"#)));
        assert!(!v(r#"{"l": [{"i": "1"}]}"#).py_eq(&v(r#"{"t": [{"i": "1"}]}"#)), "[1] != (1,)");
        assert!(v(r#"{"s": [{"i": "2"}, {"i": "1"}]}"#).py_eq(&v(r#"{"s": [{"f": "1.0"}, {"i": "2"}]}"#)));
        assert!(v(r#"{"d": [[{"u": "61"}, {"i": "1"}], [{"u": "62"}, null]]}"#).py_eq(&v(r#"{"d": [[{"u": "62"}, null], [{"u": "61"}, true]]}"#)));
        assert!(!v(r#"{"s": [{"i": "1"}, {"i": "1"}]}"#).py_eq(&v(r#"{"s": [{"i": "1"}]}"#)), "a malformed set equals nothing it should not");
        assert!(!v(r#"{"f": "nan"}"#).py_eq(&v(r#"{"f": "nan"}"#)));
        assert!(!v(r#"{"u": "31"}"#).py_eq(&one) && !v(r#"{"b": "31"}"#).py_eq(&v(r#"{"u": "31"}"#)));
        assert!(v(r#"{"u": "c3a9"}"#).py_eq(&PyValue::Str("é".into())));
        let big = "1".repeat(400);
        assert!(v(&format!(r#"{{"i": "{big}"}}"#)).py_eq(&v(&format!(r#"{{"i": "000{big}"}}"#))));
        assert!(!v(r#"{"i": "9007199254740993"}"#).py_eq(&v(r#"{"f": "9007199254740992.0"}"#)), "exact, as Python compares int and float");
        assert!(v(r#"{"f": "1e+300"}"#).py_eq(&v(&format!(r#"{{"i": "{}"}}"#, format!("{:.0}", 1e300)))));
    }

    #[test]
    fn truthiness_numbers_and_repr() {
        assert!(!v("null").truthy() && !v(r#"{"i": "0"}"#).truthy() && !v(r#"{"l": []}"#).truthy() && v(r#"{"f": "nan"}"#).truthy());
        assert_eq!(v(r#"{"i": "3"}"#).as_f64(), Some(3.0));
        assert_eq!(v(r#"{"u": "78"}"#).as_f64(), None);
        assert_eq!(v(r#"{"t": [{"i": "1"}]}"#).repr(80), "(1,)");
        assert_eq!(v(r#"{"d": [[{"u": "61"}, {"f": "0.5"}]]}"#).repr(80), r#"{"a": 0.5}"#);
    }

    #[test]
    fn anything_else_is_refused() {
        // (a lone surrogate, which Python's str allows, is no UTF-8: refused, never a wrong value)
        for bad in [r#"{"i": "1.5"}"#, r#"{"i": 1}"#, r#"{"x": 1}"#, "1", r#""s""#, r#"{"i": "1", "f": "1"}"#, r#"{"d": [[1]]}"#, r#"{"b": "zz"}"#, r#"{"u": "eda080"}"#, "[1]"] {
            assert!(PyValue::from_json(&serde_json::from_str(bad).unwrap()).is_err(), "{bad}");
        }
    }
}

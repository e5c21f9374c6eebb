//! One error type for the host side: a message that says what failed and what to do about it.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl Error {
    pub fn new(msg: impl Into<String>) -> Self {
        Error(msg.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let what = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Error(format!("CUDA driver error {name}: {what}"))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error(format!("I/O error: {e}"))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

//! What this crate knows of a device it runs on.

use std::fmt;

/// A usable GPU, as found by [`probe`](crate::probe).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability (major, minor), e.g. (9, 0) for H100/H200.
    pub compute_capability: (i32, i32),
    pub total_mem_bytes: usize,
    pub multiprocessors: i32,
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub driver_version: i32,
    pub nvrtc_version: (i32, i32),
    /// `Some(worker threads)` on the emulated device (`emu`), `None` on a GPU.
    pub emulated: Option<usize>,
}

impl GpuInfo {
    /// The NVRTC target for this device, e.g. `compute_90`.
    pub fn arch(&self) -> String {
        format!("compute_{}{}", self.compute_capability.0, self.compute_capability.1)
    }
}

impl fmt::Display for GpuInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(workers) = self.emulated {
            return write!(f, "emu: {} ({} SMs, {workers} worker threads; a correctness device, not a fast one)", self.name, self.multiprocessors);
        }
        write!(
            f,
            "cuda:{} {} (sm_{}{}, {} SMs, {:.1} GiB, driver {}.{}, NVRTC {}.{})",
            self.ordinal,
            self.name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.multiprocessors,
            self.total_mem_bytes as f64 / (1u64 << 30) as f64,
            self.driver_version / 1000,
            (self.driver_version % 1000) / 10,
            self.nvrtc_version.0,
            self.nvrtc_version.1
        )
    }
}

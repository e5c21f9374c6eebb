//! Helpers of the GPU tests (this crate's and coa-train-step's): the device to run on (the GPU, or
//! the emulated CUDA device where there is none), and seeded randomness that a failing run can
//! replay.

use crate::rng::Rng;
use crate::Gpu;

/// Which device the GPU tests were asked to run on (`COA_TEST_DEVICE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestDevice {
    /// Unset or `auto`: the GPU where one is usable, else the emulated device.
    Auto,
    /// `emu`: the emulated device even where a GPU exists.
    Emu,
    /// `cuda`: the GPU, and a test FAILS where there is none (the GPU benchmark script sets it, so
    /// a broken driver on a GPU machine cannot pass quietly on the emulator).
    Cuda,
}

impl TestDevice {
    /// `COA_TEST_DEVICE` read and checked; an unknown value is a panic naming it.
    pub fn from_env() -> TestDevice {
        let value = std::env::var("COA_TEST_DEVICE").unwrap_or_default();
        TestDevice::parse(&value).unwrap_or_else(|e| panic!("{e}"))
    }

    fn parse(value: &str) -> Result<TestDevice, String> {
        match value {
            "" | "auto" => Ok(TestDevice::Auto),
            "emu" => Ok(TestDevice::Emu),
            "cuda" => Ok(TestDevice::Cuda),
            other => Err(format!("COA_TEST_DEVICE={other}: expected emu, cuda or auto")),
        }
    }

    /// Given what the CUDA probe found (`Err(reason)` without a usable GPU): `Ok(None)` for the
    /// GPU, `Ok(Some(why))` for the emulated device, `Err` where the GPU is required but absent.
    fn choose(self, probe: Result<(), String>) -> Result<Option<String>, String> {
        match (self, probe) {
            (TestDevice::Emu, _) => Ok(Some("COA_TEST_DEVICE=emu".into())),
            (_, Ok(())) => Ok(None),
            (TestDevice::Auto, Err(e)) => Ok(Some(format!("no CUDA device: {e}"))),
            (TestDevice::Cuda, Err(e)) => Err(format!("COA_TEST_DEVICE=cuda requires a CUDA device, found none: {e}")),
        }
    }
}

/// The device a GPU test runs on: the GPU where one is usable, else the emulated CUDA device (the
/// same kernels and host code on the CPU); a line says which and why. `COA_TEST_DEVICE` overrides
/// (see [`TestDevice`]). Panics, failing the test, where the asked-for device cannot be had or a
/// device is found but cannot be opened.
pub fn test_gpu(test: &str) -> Gpu {
    let say = |line: String| {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "{line}");
        println!("{line}");
    };
    let wanted = TestDevice::from_env();
    let probe = if wanted == TestDevice::Emu { Ok(()) } else { crate::probe().map(|_| ()).map_err(|e| e.to_string()) };
    match wanted.choose(probe) {
        Ok(None) => Gpu::new(0).unwrap_or_else(|e| panic!("{test}: GPU found but unusable: {e}")),
        Ok(Some(why)) => {
            say(format!("{test}: on the emulated CUDA device ({why})"));
            Gpu::emulated().unwrap_or_else(|e| panic!("{test}: the emulated CUDA device cannot be opened: {e}"))
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

/// The device a benchmark binary times (`COA_BENCH_DEVICE`: `cuda`, the default, or `emu`, the
/// emulated device the GPU script's rehearsal runs on; `bench/gpu/run.sh`), and whether it runs
/// its small shapes (`COA_BENCH_SMALL=1`: the same code paths in seconds on the emulated device,
/// numbers that mean nothing).
pub fn bench_gpu() -> crate::Result<Gpu> {
    match std::env::var("COA_BENCH_DEVICE").as_deref() {
        Ok("emu") => Gpu::emulated(),
        Ok("cuda") | Ok("") | Err(_) => {
            let info = crate::probe().map_err(|e| crate::Error::new(format!("COA_BENCH_DEVICE=cuda: {e}")))?;
            Gpu::new(info.ordinal)
        }
        Ok(other) => Err(crate::Error::new(format!("COA_BENCH_DEVICE={other:?}: expected cuda or emu"))),
    }
}

/// `COA_BENCH_SMALL=1`: see [`bench_gpu`].
pub fn bench_small() -> bool {
    std::env::var("COA_BENCH_SMALL").is_ok_and(|v| v == "1")
}

/// A generator seeded from `COA_TEST_SEED` if set, else fresh; the seed is printed so a failure
/// can be replayed.
pub fn seeded(test: &str) -> Rng {
    let seed = std::env::var("COA_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(Rng::fresh_seed);
    eprintln!("{test}: seed {seed} (replay with COA_TEST_SEED={seed})");
    println!("{test}: seed {seed}");
    Rng::new(seed)
}

#[cfg(test)]
mod tests {
    use super::TestDevice;

    #[test]
    fn test_device_choice() {
        let none = || Err("no driver".to_string());
        assert_eq!(TestDevice::parse("").unwrap(), TestDevice::Auto);
        assert_eq!(TestDevice::parse("cuda").unwrap(), TestDevice::Cuda);
        assert!(TestDevice::parse("gpu").unwrap_err().contains("COA_TEST_DEVICE=gpu: expected emu, cuda or auto"));
        assert_eq!(TestDevice::Auto.choose(Ok(())), Ok(None));
        assert_eq!(TestDevice::Cuda.choose(Ok(())), Ok(None));
        assert_eq!(TestDevice::Auto.choose(none()), Ok(Some("no CUDA device: no driver".into())));
        assert_eq!(TestDevice::Emu.choose(Ok(())), Ok(Some("COA_TEST_DEVICE=emu".into())));
        // Required and absent: an error (the test fails), never a skip or the emulator.
        let e = TestDevice::Cuda.choose(none()).unwrap_err();
        assert_eq!(e, "COA_TEST_DEVICE=cuda requires a CUDA device, found none: no driver");
    }
}

//! `--device auto|cpu|cuda` never panics: on a machine without a GPU `cuda` is a clear error and
//! `auto` falls back to the CPU; on a GPU machine both give the GPU.

use coa_kernels::testing::TestDevice;
use coa_kernels::{probe, select_device, Device, DeviceChoice};

#[test]
fn parse_device_choice() {
    assert_eq!("auto".parse::<DeviceChoice>().unwrap(), DeviceChoice::Auto);
    assert_eq!("cpu".parse::<DeviceChoice>().unwrap(), DeviceChoice::Cpu);
    assert_eq!("cuda".parse::<DeviceChoice>().unwrap(), DeviceChoice::Cuda(0));
    assert_eq!("cuda:3".parse::<DeviceChoice>().unwrap(), DeviceChoice::Cuda(3));
    let e = "tpu".parse::<DeviceChoice>().unwrap_err();
    assert!(e.contains("auto, cpu, cuda"), "{e}");
    assert_eq!(DeviceChoice::Cuda(0).to_string(), "cuda");
}

#[test]
fn cpu_is_always_available() {
    assert_eq!(select_device(DeviceChoice::Cpu).unwrap(), Device::Cpu);
}

#[test]
fn cuda_and_auto_follow_the_probe() {
    match probe() {
        Err(reason) => {
            assert!(TestDevice::from_env() != TestDevice::Cuda, "COA_TEST_DEVICE=cuda requires a CUDA device, found none: {reason}");
            assert!(!reason.0.is_empty());
            let e = select_device(DeviceChoice::Cuda(0)).unwrap_err();
            assert!(e.0.starts_with("--device cuda: "), "{e}");
            assert!(e.0.contains(&reason.0), "{e} / {reason}");
            assert_eq!(select_device(DeviceChoice::Auto).unwrap(), Device::Cpu);
            println!("no GPU here: {reason}");
        }
        Ok(info) => {
            assert!(info.compute_capability.0 >= 8);
            assert_eq!(select_device(DeviceChoice::Cuda(0)).unwrap(), Device::Cuda(info.clone()));
            assert_eq!(select_device(DeviceChoice::Auto).unwrap(), Device::Cuda(info));
            // An ordinal past the last GPU is an error, not a panic.
            assert!(select_device(DeviceChoice::Cuda(1000)).is_err());
        }
    }
}

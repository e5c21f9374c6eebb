//! The emulated CUDA device itself (`coa_kernels::emu`): `--device emu` selects it; its warp
//! primitives follow the PTX ISA (mma.sync m16n8k16 and ldmatrix .x4 / .trans fragment layouts);
//! its four schedule orders run a block's threads as documented; it refuses what a GPU refuses,
//! with an error naming the kernel, block and thread, and keeps working afterwards; barriers and
//! cp.async waits are enforced (shared memory is poisoned, so a read that comes too early is NaN);
//! its cuBLAS has cuBLAS's semantics (column-major, op(A)/op(B), leading dimensions, alpha/beta)
//! and rejections; every entry point the CUDA path loads is compiled into it.
//!
//! The kernels launched here are `kernels/emu/hazards.cu`, compiled into the emulated device only.
//! This test process loads the emulated device in place of the CUDA driver, GPU or not.

use std::sync::Arc;

use coa_kernels::cudarc::cublas::result as blas;
use coa_kernels::cudarc::cublas::sys as blas_sys;
use coa_kernels::cudarc::driver::{CudaFunction, CudaModule, DevicePtr, DevicePtrMut, LaunchArgs, LaunchConfig, PushKernelArg};
use coa_kernels::cudarc::nvrtc::Ptx;
use coa_kernels::emu::{self, Order};
use coa_kernels::rng::Rng;
use coa_kernels::testing::seeded;
use coa_kernels::{bf16, ops, select_device, Device, DeviceChoice, Error, Gpu};

fn emulated() -> Gpu {
    Gpu::emulated().expect("the emulated CUDA device")
}

fn hazards(gpu: &Gpu) -> Arc<CudaModule> {
    gpu.ctx.load_module(Ptx::from_src("coa-emu:emu_hazards".to_string())).expect("the emulator's test kernels")
}

fn cfg(grid: u32, block: u32, smem: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: smem }
}

/// Launches and turns the driver's answer into this crate's error (with the emulator's message).
fn run(mut b: LaunchArgs<'_>, c: LaunchConfig) -> Result<(), Error> {
    // SAFETY: the test kernels index only the buffers each call passes, within their lengths.
    unsafe { b.launch(c) }.map(drop).map_err(Error::from)
}

#[test]
fn device_emu_is_selectable() {
    assert_eq!("emu".parse::<DeviceChoice>().unwrap(), DeviceChoice::Emu);
    assert_eq!(DeviceChoice::Emu.to_string(), "emu");
    let Device::Cuda(info) = select_device(DeviceChoice::Emu).unwrap() else { panic!("--device emu must give a CUDA device") };
    assert!(info.emulated.is_some_and(|w| w >= 1), "{info:?}");
    assert_eq!(info.compute_capability, (9, 0));
    let shown = info.to_string();
    assert!(shown.starts_with("emu: ") && shown.contains("not a fast one"), "{shown}");
    let gpu = Gpu::open(&info).unwrap();
    assert!(gpu.is_emulated() && gpu.compiler.is_none());
    // Once loaded, the process has no real GPU: the probe never takes the emulator for one.
    let e = coa_kernels::probe().unwrap_err();
    assert!(e.0.contains("no NVIDIA driver") || e.0.contains("emulated"), "{e}");
}

/// Every entry point the CUDA path loads (ops::SOURCES) is compiled into the emulated device.
#[test]
fn every_entry_point_is_compiled_in() {
    let gpu = emulated();
    for s in ops::SOURCES {
        for e in s.entry_points {
            gpu.func(s, e).unwrap_or_else(|err| panic!("kernels/{}.cu: {e}: {err}", s.name));
        }
    }
    let e = gpu.ctx.load_module(Ptx::from_src("coa-emu:no_such_file".to_string())).unwrap_err();
    assert!(Error::from(e).0.contains("no module no_such_file"));
}

fn bf16_bits(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

/// One mma.sync with fragments gathered by the ISA's layout rules (hazards.cu `mma_probe`) equals
/// the f32 product; ldmatrix.x4 of a tile gives each lane the elements the ISA assigns it.
#[test]
fn mma_and_ldmatrix_follow_the_ptx_isa() {
    let gpu = emulated();
    let m = hazards(&gpu);
    let mut rng = seeded("mma_and_ldmatrix_follow_the_ptx_isa");
    let round = |v: Vec<f32>| -> Vec<f32> { v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect() };
    let a = round(rng.normals(256, 1.0)); // [16, 16] row-major
    let bt = round(rng.normals(128, 1.0)); // B transposed: [8, 16], row n = column n of B
    let c = rng.normals(128, 1.0); // [16, 8]
    let (ad, bd, cd) = (gpu.upload_bf16(&a).unwrap(), gpu.upload_bf16(&bt).unwrap(), gpu.upload(&c).unwrap());
    let mut dd = gpu.upload(&vec![f32::NAN; 128]).unwrap();
    let f = m.load_function("mma_probe").unwrap();
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&ad).arg(&bd).arg(&cd).arg(&mut dd);
    run(b, cfg(1, 32, 0)).unwrap();
    let d = gpu.download(&dd).unwrap();
    for i in 0..16 {
        for j in 0..8 {
            let want: f64 = (0..16).map(|k| a[i * 16 + k] as f64 * bt[j * 16 + k] as f64).sum::<f64>() + c[i * 8 + j] as f64;
            assert!((d[i * 8 + j] as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "D[{i}][{j}] = {} want {want}", d[i * 8 + j]);
        }
    }

    // A 16x16 tile of distinct values; lane l addresses row l % 16, column 8 (l / 16): the four
    // 8x8 matrices are the quadrants (rows 0-7 | 8-15) x (columns 0-7 | 8-15), in the order the
    // lanes' addresses give them.
    let tile: Vec<f32> = (0..256).map(|i| i as f32).collect();
    let td = gpu.upload_bf16(&tile).unwrap();
    let mut od = gpu.upload(&vec![0u32; 256]).unwrap();
    let f = m.load_function("ldmatrix_probe").unwrap();
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&td).arg(&mut od);
    run(b, cfg(1, 32, 512)).unwrap();
    let o = gpu.download(&od).unwrap();
    let at = |mat: usize, r: usize, col: usize| -> u16 {
        let (r0, c0) = ((mat % 2) * 8, (mat / 2) * 8);
        bf16_bits(tile[(r0 + r) * 16 + c0 + col])
    };
    for lane in 0..32 {
        for mat in 0..4 {
            // Plain: row lane/4, columns 2(lane%4), +1. Transposed: column lane/4, rows 2(lane%4), +1.
            let plain = at(mat, lane / 4, 2 * (lane % 4)) as u32 | (at(mat, lane / 4, 2 * (lane % 4) + 1) as u32) << 16;
            let trans = at(mat, 2 * (lane % 4), lane / 4) as u32 | (at(mat, 2 * (lane % 4) + 1, lane / 4) as u32) << 16;
            assert_eq!(o[lane * 8 + mat], plain, "ldmatrix lane {lane} matrix {mat}");
            assert_eq!(o[lane * 8 + 4 + mat], trans, "ldmatrix.trans lane {lane} matrix {mat}");
        }
    }
}

/// The order in which one block of 64 threads logs itself, meets its warp at __syncwarp, and logs
/// again (hazards.cu `order_probe`).
fn order_log(gpu: &Gpu, f: &CudaFunction, order: Order) -> Vec<i32> {
    emu::set_order(Some(order)).unwrap();
    let mut log = gpu.zeros::<i32>(128).unwrap();
    let mut count = gpu.zeros::<i32>(1).unwrap();
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&mut log).arg(&mut count);
    run(b, cfg(1, 64, 0)).unwrap();
    emu::set_order(None).unwrap();
    gpu.download(&log).unwrap()
}

#[test]
fn schedule_orders_run_threads_as_documented() {
    let gpu = emulated();
    let f = hazards(&gpu).load_function("order_probe").unwrap();
    let seq = |r: std::ops::Range<i32>| r.collect::<Vec<i32>>();
    let cat = |parts: Vec<Vec<i32>>| parts.concat();
    // Round robin: each thread runs until it waits; released warps queue behind the others.
    assert_eq!(order_log(&gpu, &f, Order::Forward), cat(vec![seq(0..64), seq(1000..1064)]));
    assert_eq!(
        order_log(&gpu, &f, Order::Reverse),
        cat(vec![seq(0..64).into_iter().rev().collect(), seq(1032..1064).into_iter().rev().collect(), seq(1000..1032).into_iter().rev().collect()])
    );
    // Warp 0 runs to its end before warp 1 starts.
    assert_eq!(order_log(&gpu, &f, Order::MaxDrift), cat(vec![seq(0..32), seq(1000..1032), seq(32..64), seq(1032..1064)]));
    let r1 = order_log(&gpu, &f, Order::Random(1));
    assert_eq!(r1, order_log(&gpu, &f, Order::Random(1)), "a seed replays its order");
    assert_ne!(r1, order_log(&gpu, &f, Order::Random(2)), "another seed, another order");
    let mut sorted = r1.clone();
    sorted.sort();
    assert_eq!(sorted, cat(vec![seq(0..64), seq(1000..1064)]), "every thread logs twice");
    assert_ne!(r1[..64].to_vec(), seq(0..64), "random is not index order");
    for t in 0..64 {
        let first = r1.iter().position(|&x| x == t).unwrap();
        let second = r1.iter().position(|&x| x == 1000 + t).unwrap();
        assert!(first < second, "thread {t} logged its second entry first");
    }
    assert_eq!(emu::order().unwrap(), "forward", "set_order(None) restores COA_EMU_ORDER's (unset here)");
}

/// Every kernel fault and launch the emulator refuses, its CUresult and the words of its message;
/// the device works normally afterwards.
#[test]
fn what_a_gpu_refuses_is_an_error() {
    let gpu = emulated();
    let m = hazards(&gpu);
    let mut out = gpu.zeros::<f32>(1024).unwrap();
    let g = gpu.upload_bf16(&vec![1.0f32; 1024]).unwrap();
    let fails = |name: &str, e: Result<(), Error>, code: &str, words: &[&str]| {
        let e = e.expect_err(name).0;
        assert!(e.contains(code), "{name}: {e}");
        for w in words {
            assert!(e.contains(w), "{name}: the message must say {w:?}: {e}");
        }
    };
    // Launch configurations.
    let bounded = m.load_function("bounded").unwrap();
    let mut b = gpu.stream.launch_builder(&bounded);
    b.arg(&mut out);
    fails("1025 threads in x", run(b, cfg(1, 1025, 0)), "CUDA_ERROR_INVALID_VALUE", &["bounded", "block (1025,1,1)", "outside the device's limits"]);
    let mut b = gpu.stream.launch_builder(&bounded);
    b.arg(&mut out);
    let c = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 33, 1), shared_mem_bytes: 0 };
    fails("1056 threads", run(b, c), "CUDA_ERROR_INVALID_VALUE", &["bounded", "1056 threads", "at most 1024"]);
    let mut b = gpu.stream.launch_builder(&bounded);
    b.arg(&mut out);
    fails("over __launch_bounds__", run(b, cfg(1, 65, 0)), "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", &["65 threads", "__launch_bounds__", "at most 64"]);
    let mut b = gpu.stream.launch_builder(&bounded);
    b.arg(&mut out);
    fails("dynamic shared memory over the limit", run(b, cfg(1, 32, 64 * 1024)), "CUDA_ERROR_INVALID_VALUE", &["dynamic shared memory", "allows 49152"]);
    let f = gpu.func(&coa_kernels::ops::elementwise::SOURCE, "sumsq_f32").unwrap(); // raised to the device's opt-in limit
    let (n, mut part) = (8i64, gpu.zeros::<f32>(1).unwrap());
    let x = gpu.zeros::<f32>(8).unwrap();
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&x).arg(&mut part).arg(&n);
    fails("over the device's shared memory", run(b, cfg(1, 32, 232448 + 16)), "CUDA_ERROR_INVALID_VALUE", &["sumsq_f32", "at most 232448"]);
    // Static shared memory counts too (its size measured per kernel at build time, over the
    // functions the kernel reaches): sumsq_f32 declares `__shared__ float scratch[32]` (128 bytes),
    // so 232448 - 128 dynamic bytes fit and 16 more do not.
    use coa_kernels::cudarc::driver::sys::CUfunction_attribute as attr;
    let static_smem = |src, name| gpu.func(src, name).unwrap().get_attribute(attr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES).unwrap();
    assert_eq!(static_smem(&coa_kernels::ops::elementwise::SOURCE, "sumsq_f32"), 128);
    // `__shared__ int first_key` in the template the entry point instantiates
    assert_eq!(static_smem(&coa_kernels::ops::attention::SOURCE, "flash_attn_fwd_d64"), 4);
    // `__shared__ float qs[DEC_WARPS][DEC_MAX_D]`: 4 x 256 floats
    assert_eq!(static_smem(&coa_kernels::ops::decode_attention::SOURCE, "attn_extend"), 4096);
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&x).arg(&mut part).arg(&n);
    fails("static + dynamic over the device's shared memory", run(b, cfg(1, 32, 232448 - 128 + 16)), "CUDA_ERROR_INVALID_VALUE",
        &["sumsq_f32", "128 bytes of static + 232336 bytes of dynamic shared memory = 232464", "at most 232448"]);
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&x).arg(&mut part).arg(&n);
    run(b, cfg(1, 32, 232448 - 128)).expect("static + dynamic at the limit");
    let neighbour_read = m.load_function("neighbour_read").unwrap(); // `__shared__ float slot[1024]`
    assert_eq!(neighbour_read.get_attribute(attr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES).unwrap(), 4096);
    let raised = neighbour_read.set_attribute(attr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 232448 - 4096 + 1);
    fails("dynamic limit raised past static", raised.map_err(Error::from), "CUDA_ERROR_INVALID_VALUE", &["neighbour_read", "4096 bytes of static shared memory"]);
    let mut b = gpu.stream.launch_builder(&bounded);
    b.arg(&mut out);
    fails("empty grid", run(b, LaunchConfig { grid_dim: (0, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 }), "CUDA_ERROR_INVALID_VALUE", &["grid (0,1,1)"]);

    // Faults inside kernels.
    let k = |name: &str| m.load_function(name).unwrap();
    let mut o32 = gpu.zeros::<u32>(64).unwrap();
    let f = k("ldmatrix_misaligned");
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&mut o32);
    fails("ldmatrix misaligned", run(b, cfg(1, 32, 1024)), "CUDA_ERROR_MISALIGNED_ADDRESS", &["ldmatrix_misaligned, block (0,0,0), thread (0,0,0)", "not 16-byte aligned"]);
    let f = k("ldmatrix_from_global");
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&g).arg(&mut o32);
    fails("ldmatrix from global", run(b, cfg(1, 32, 0)), "CUDA_ERROR_ILLEGAL_ADDRESS", &["ldmatrix_from_global", "not in the block's shared memory"]);
    let f = k("cp_async_misaligned");
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&g).arg(&mut out);
    fails("cp.async misaligned", run(b, cfg(1, 32, 64)), "CUDA_ERROR_MISALIGNED_ADDRESS", &["cp.async", "16-byte aligned"]);
    let f = k("shuffle_some_lanes_skip");
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&mut out);
    fails("a shuffle some lanes skip", run(b, cfg(2, 64, 0)), "CUDA_ERROR_LAUNCH_FAILED", &["shuffle_some_lanes_skip", "some lanes of its mask skip"]);
    let f = k("deadlock");
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&mut out);
    fails("deadlock", run(b, cfg(1, 64, 0)), "CUDA_ERROR_LAUNCH_FAILED", &["deadlock", "wait at __syncthreads", "warp 0"]);
    let f = k("divergent_collectives");
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&mut out);
    fails("divergent collectives", run(b, cfg(1, 32, 0)), "CUDA_ERROR_LAUNCH_FAILED", &["divergent warp collectives"]);

    // Still a working device.
    let mut b = gpu.stream.launch_builder(&bounded);
    b.arg(&mut out);
    run(b, cfg(1, 64, 0)).unwrap();
    assert_eq!(gpu.download(&out).unwrap()[..64], vec![1.0f32; 64][..]);
}

/// A read of a neighbour's shared slot without the barrier between write and read gets the
/// poison (NaN) in every schedule order, and the right value with it; a cp.async lands at its
/// wait_group in forward order (a read before the wait sees the poison), at its issue in max-drift.
/// (With the memory checks off: on, the missing barrier is an error, see `memory_checks_*`.)
#[test]
fn barriers_and_async_copies_are_enforced() {
    let gpu = emulated();
    emu::set_checks(Some(false)).unwrap();
    let m = hazards(&gpu);
    let f = m.load_function("neighbour_read").unwrap();
    let n = 256usize;
    for order in Order::all(5) {
        emu::set_order(Some(order)).unwrap();
        for barrier in [1i32, 0] {
            let mut out = gpu.zeros::<f32>(n).unwrap();
            let mut b = gpu.stream.launch_builder(&f);
            b.arg(&mut out).arg(&barrier);
            run(b, cfg(3, n as u32, 0)).unwrap();
            let got = gpu.download(&out).unwrap();
            if barrier == 1 {
                let want: Vec<f32> = (0..n).map(|i| ((i + 1) % n) as f32).collect();
                assert_eq!(got, want, "{order}: with the barrier");
            } else {
                assert!(got.iter().any(|x| x.is_nan()), "{order}: a missing barrier must show: {got:?}");
            }
        }
    }
    let f = m.load_function("cp_async_read_before_wait").unwrap();
    let src: Vec<f32> = (0..128).map(|i| i as f32).collect();
    let gd = gpu.upload(&src).unwrap();
    let data: Vec<f32> = (0..32).map(|t| (4 * t) as f32).collect();
    for order in [Order::Forward, Order::MaxDrift] {
        emu::set_order(Some(order)).unwrap();
        let mut out = gpu.zeros::<f32>(64).unwrap();
        let mut b = gpu.stream.launch_builder(&f);
        b.arg(&gd).arg(&mut out);
        run(b, cfg(1, 32, 512)).unwrap();
        let got = gpu.download(&out).unwrap();
        if order == Order::Forward {
            // Copies land at their wait: the read before it sees the poison.
            assert!(got[..32].iter().all(|x| x.is_nan()), "before the wait: {:?}", &got[..32]);
        } else {
            // Copies land at their issue.
            assert_eq!(got[..32].to_vec(), data, "max-drift: before the wait");
        }
        assert_eq!(got[32..].to_vec(), data, "{order}: after the wait");
    }
    emu::set_order(None).unwrap();
    emu::set_checks(None).unwrap();
}

/// `cublasGemmEx` called directly, column-major with padded leading dimensions and every
/// transpose: C = alpha op(A) op(B) + beta C, against a reference written from cuBLAS's
/// definition; beta = 0 does not read C; too-small leading dimensions and operands outside their
/// allocation are errors.
#[test]
fn gemm_has_cublas_semantics() {
    use blas_sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
    use blas_sys::cudaDataType::{CUDA_R_16BF, CUDA_R_32F};
    let gpu = emulated();
    let mut rng = seeded("gemm_has_cublas_semantics");
    let (m, n, k) = (5usize, 7usize, 9usize);
    let round = |v: Vec<f32>| -> Vec<f32> { v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect() };
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        // Stored shapes (column-major): A is m x k (lda >= m) or k x m (lda >= k) transposed.
        let (ar, ac) = if ta { (k, m) } else { (m, k) };
        let (br, bc) = if tb { (n, k) } else { (k, n) };
        let (lda, ldb, ldc) = (ar + 3, br + 2, m + 1);
        let a = round(rng.normals(lda * ac, 1.0));
        let b = round(rng.normals(ldb * bc, 1.0));
        let c0 = rng.normals(ldc * n, 1.0);
        let (alpha, beta) = (0.5f32, 2.0f32);
        let opa = |i: usize, l: usize| if ta { a[l + i * lda] } else { a[i + l * lda] };
        let opb = |l: usize, j: usize| if tb { b[j + l * ldb] } else { b[l + j * ldb] };
        let mut want = c0.clone();
        for j in 0..n {
            for i in 0..m {
                let dot: f64 = (0..k).map(|l| opa(i, l) as f64 * opb(l, j) as f64).sum();
                want[i + j * ldc] = (alpha as f64 * dot + beta as f64 * c0[i + j * ldc] as f64) as f32;
            }
        }
        let (ad, bd) = (gpu.upload_bf16(&a).unwrap(), gpu.upload_bf16(&b).unwrap());
        let mut cd = gpu.upload(&c0).unwrap();
        let half_b = gpu.upload_bf16(&b[..b.len() / 2]).unwrap();
        let call = |lda: usize, bd: &coa_kernels::cudarc::driver::CudaSlice<bf16>, c: &mut coa_kernels::cudarc::driver::CudaSlice<f32>, beta: f32| -> Result<(), Error> {
            let (ap, _g1) = ad.device_ptr(&gpu.stream);
            let (bp, _g2) = bd.device_ptr(&gpu.stream);
            let (cp, _g3) = c.device_ptr_mut(&gpu.stream);
            let op = |t: bool| if t { CUBLAS_OP_T } else { CUBLAS_OP_N };
            // SAFETY: the emulated cuBLAS checks every operand against its allocation.
            unsafe {
                blas::gemm_ex(
                    *gpu.blas.handle(), op(ta), op(tb), m as i32, n as i32, k as i32,
                    (&alpha) as *const f32 as *const _, ap as *const _, CUDA_R_16BF, lda as i32,
                    bp as *const _, CUDA_R_16BF, ldb as i32, (&beta) as *const f32 as *const _,
                    cp as *mut _, CUDA_R_32F, ldc as i32,
                    blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(Error::from)
        };
        call(lda, &bd, &mut cd, beta).unwrap();
        let got = gpu.download(&cd).unwrap();
        for (idx, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "ta {ta} tb {tb}: C[{idx}] = {g}, want {w}");
        }
        // beta = 0: C is written, not read (NaN there does not survive).
        let mut cn = gpu.upload(&vec![f32::NAN; ldc * n]).unwrap();
        call(lda, &bd, &mut cn, 0.0).unwrap();
        let got = gpu.download(&cn).unwrap();
        assert!((0..n).all(|j| (0..m).all(|i| got[i + j * ldc].is_finite())), "beta 0 must not read C");
        assert!(got[m].is_nan(), "the padding rows of C are not written");
        // cuBLAS's rejections.
        let e = call(ar - 1, &bd, &mut cd, beta).unwrap_err();
        assert!(e.0.contains("CUBLAS_STATUS_INVALID_VALUE") && e.0.contains("leading dimensions"), "{e}");
        let e = call(lda, &half_b, &mut cd, beta).unwrap_err();
        assert!(e.0.contains("CUBLAS_STATUS_EXECUTION_FAILED") && e.0.contains("outside its device allocation"), "{e}");
    }
}

/// The poison is visible to a kernel that reads shared memory it never wrote, in every block (not
/// only the first one a worker runs).
#[test]
fn shared_memory_is_poisoned_per_block() {
    let gpu = emulated();
    let m = hazards(&gpu);
    let f = m.load_function("neighbour_read").unwrap();
    let mut rng = Rng::new(3);
    let n = 64usize;
    let blocks = 2 + rng.below(30) as u32;
    let mut out = gpu.zeros::<f32>(n).unwrap();
    let no_barrier = 0i32;
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&mut out).arg(&no_barrier);
    emu::set_order(Some(Order::Forward)).unwrap();
    emu::set_checks(Some(false)).unwrap(); // on, the missing barrier is an error
    run(b, cfg(blocks, n as u32, 0)).unwrap();
    emu::set_checks(None).unwrap();
    emu::set_order(None).unwrap();
    // Forward order: thread i reads slot i + 1 before thread i + 1 writes it, in every block.
    let got = gpu.download(&out).unwrap();
    assert!(got[..n - 1].iter().all(|x| x.is_nan()) && got[n - 1] == 0.0, "{got:?}");
}

/// The memory checks (emu/runtime.h), on by default: every out-of-bounds access, race between
/// blocks, missing barrier and partial barrier of `hazards.cu` is an error naming the kernel, block
/// and thread, in every schedule order, and the correct variant of each kernel passes.
#[test]
fn memory_checks_report_kernel_block_and_thread() {
    let gpu = emulated();
    let m = hazards(&gpu);
    let k = |name: &str| m.load_function(name).unwrap();
    // On by default (COA_EMU_CHECKS unset); on here whatever it says.
    let default_on = std::env::var("COA_EMU_CHECKS").map_or(true, |v| v != "0" && v != "off");
    assert_eq!(emu::set_checks(None).unwrap(), default_on, "COA_EMU_CHECKS's choice");
    assert!(emu::set_checks(Some(true)).unwrap());
    let fails = |name: &str, e: Result<(), Error>, words: &[&str]| {
        let e = e.expect_err(name).0;
        for w in words {
            assert!(e.contains(w), "{name}: the message must say {w:?}: {e}");
        }
    };
    for order in Order::all(11) {
        emu::set_order(Some(order)).unwrap();
        let name = |what: &str| format!("{order}: {what}");

        // Device buffers: 2 blocks of 64 threads over 100 floats (the allocation's rounding and
        // guard zone are outside it too).
        let f = k("global_overrun");
        let short = gpu.upload(&vec![1.0f32; 100]).unwrap();
        let mut long = gpu.zeros::<f32>(128).unwrap();
        let mut b = gpu.stream.launch_builder(&f);
        let read = 0i32;
        b.arg(&short).arg(&mut long).arg(&read);
        fails(&name("global read overrun"), run(b, cfg(2, 64, 0)), &["CUDA_ERROR_ILLEGAL_ADDRESS", "global_overrun, block (1,0,0), thread (", "reads 4 bytes",
            "outside every device allocation", "into the allocation at", "of 400 bytes"]);
        let mut short_out = gpu.zeros::<f32>(100).unwrap();
        let mut b = gpu.stream.launch_builder(&f);
        let write = 1i32;
        b.arg(&short).arg(&mut short_out).arg(&write);
        fails(&name("global write overrun"), run(b, cfg(2, 64, 0)), &["CUDA_ERROR_ILLEGAL_ADDRESS", "global_overrun, block (1,0,0), thread (", "writes 4 bytes",
            "outside every device allocation", "of 400 bytes"]);
        let mut b = gpu.stream.launch_builder(&f);
        b.arg(&short).arg(&mut long).arg(&read);
        run(b, cfg(1, 64, 0)).expect("within bounds");

        // Dynamic shared memory: 64 threads write 64 words into 128 bytes.
        let f = k("dynamic_shared_overrun");
        let mut out = gpu.zeros::<f32>(64).unwrap();
        let mut b = gpu.stream.launch_builder(&f);
        b.arg(&mut out);
        fails(&name("dynamic shared overrun"), run(b, cfg(1, 64, 128)), &["CUDA_ERROR_ILLEGAL_ADDRESS", "dynamic_shared_overrun, block (0,0,0), thread (",
            "writes 4 bytes at byte ", "of the dynamic shared memory (128 bytes)", "outside the block's shared memory"]);
        let mut b = gpu.stream.launch_builder(&f);
        b.arg(&mut out);
        run(b, cfg(1, 64, 256)).expect("within the dynamic shared memory");

        // Static shared memory: 64 threads write a 32-word __shared__ array.
        let f = k("static_shared_overrun");
        let mut b = gpu.stream.launch_builder(&f);
        b.arg(&mut out);
        fails(&name("static shared overrun"), run(b, cfg(1, 64, 0)), &["CUDA_ERROR_ILLEGAL_ADDRESS", "static_shared_overrun, block (0,0,0), thread (",
            "writes 4 bytes at static shared memory", "outside the kernel's static __shared__ variables", "of `static_shared_overrun::words`, 128 bytes)"]);
        let mut b = gpu.stream.launch_builder(&f);
        b.arg(&mut out);
        run(b, cfg(1, 32, 0)).expect("within the static shared memory");

        // A lost update: 16 blocks of 64 threads add 1 to 8 sums, 128 each.
        let f = k("count_up");
        for mode in [0i32, 1, 2] {
            let mut acc = gpu.zeros::<f32>(8).unwrap();
            let mut sums = gpu.zeros::<f32>(16).unwrap();
            let mut b = gpu.stream.launch_builder(&f);
            b.arg(&mut acc).arg(&mut sums).arg(&mode);
            let r = run(b, cfg(16, 64, 0));
            match mode {
                0 => {
                    // The other side is named when the shadow holds one block, else "other
                    // blocks" (several read it: which, depends on how the workers interleaved).
                    let e = r.as_ref().err().map(|e| e.0.clone()).unwrap_or_default();
                    assert!(e.contains("that block (") || e.contains("that other blocks"), "{order}: the other side: {e}");
                    fails(&name("plain read-modify-write"), r, &["CUDA_ERROR_LAUNCH_FAILED", "count_up, block (", "race between blocks of one launch"])
                }
                1 => {
                    r.expect("atomics");
                    assert_eq!(gpu.download(&acc).unwrap(), vec![128.0f32; 8], "{order}: every atomic update counts");
                }
                // the read, or a later atomic update of what it read
                _ => fails(&name("plain read of atomics"), r, &["count_up, block (", "race between blocks of one launch", "atomically"]),
            }
        }

        // A missing barrier, a missing __syncwarp.
        let f = k("neighbour_read");
        for barrier in [1i32, 0] {
            let mut out = gpu.zeros::<f32>(256).unwrap();
            let mut b = gpu.stream.launch_builder(&f);
            b.arg(&mut out).arg(&barrier);
            let r = run(b, cfg(1, 256, 0));
            if barrier == 1 {
                r.expect("with the barrier");
            } else {
                fails(&name("missing barrier"), r, &["CUDA_ERROR_LAUNCH_FAILED", "neighbour_read, block (0,0,0), thread (", "shared memory race",
                    "static shared memory", "since the last __syncthreads (a missing barrier)"]);
            }
        }
        let f = k("warp_exchange");
        for sync in [1i32, 0] {
            let mut out = gpu.zeros::<f32>(64).unwrap();
            let mut b = gpu.stream.launch_builder(&f);
            b.arg(&mut out).arg(&sync);
            let r = run(b, cfg(1, 64, 0));
            if sync == 1 {
                r.expect("__syncwarp orders the warp's shared accesses");
                let want: Vec<f32> = (0..64).map(|i| (i ^ 1) as f32).collect();
                assert_eq!(gpu.download(&out).unwrap(), want);
            } else {
                fails(&name("missing __syncwarp"), r, &["warp_exchange", "shared memory race"]);
            }
        }

        // A barrier only some threads reach.
        let f = k("partial_barrier");
        for mode in [0i32, 1] {
            let mut out = gpu.zeros::<f32>(128).unwrap();
            let mut b = gpu.stream.launch_builder(&f);
            b.arg(&mut out).arg(&mode);
            fails(&name("partial barrier"), run(b, cfg(1, 128, 0)), &["CUDA_ERROR_LAUNCH_FAILED", "partial_barrier, block (0,0,0), thread (",
                "a barrier that only some threads of the block reach"]);
        }
    }
    emu::set_order(None).unwrap();

    // Off, the same kernels run (as they did before the checks): the lost update does not show.
    emu::set_checks(Some(false)).unwrap();
    let mut acc = gpu.zeros::<f32>(8).unwrap();
    let mut sums = gpu.zeros::<f32>(16).unwrap();
    let count_up = k("count_up");
    let mut b = gpu.stream.launch_builder(&count_up);
    let mode = 0i32;
    b.arg(&mut acc).arg(&mut sums).arg(&mode);
    run(b, cfg(16, 64, 0)).expect("checks off");
    assert_eq!(emu::set_checks(None).unwrap(), default_on, "None restores COA_EMU_CHECKS's choice");

    // Still a working device.
    let f = k("bounded");
    let mut out = gpu.zeros::<f32>(64).unwrap();
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&mut out);
    run(b, cfg(1, 64, 0)).unwrap();
    assert_eq!(gpu.download(&out).unwrap(), vec![1.0f32; 64]);
}

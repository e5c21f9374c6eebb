//! Matmuls on cuBLAS (`cublasGemmEx`, bf16 in, bf16 or f32 out, fp32 compute), each described by
//! a `coa_model::ops::Gemm` as the CPU reference `coa_model::ops::gemm` takes it, and the linear
//! layer built on them (forward, and backward into the f32 gradient buffer; biases through k = 1
//! products with a ones vector). Test: `tests/gpu_kernels/gemm.rs`.

use coa_model::ops::Gemm;
use cudarc::cublas::sys as blas_sys;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr};
use half::bf16;

use crate::error::Result;
use crate::gpu::{check_len, i32_of, Gpu};

/// Output element types of [`Gpu::gemm`]: bf16 activations or f32 gradient accumulators.
pub trait GemmOut: DeviceRepr {
    const DTYPE: blas_sys::cudaDataType;
}
impl GemmOut for bf16 {
    const DTYPE: blas_sys::cudaDataType = blas_sys::cudaDataType::CUDA_R_16BF;
}
impl GemmOut for f32 {
    const DTYPE: blas_sys::cudaDataType = blas_sys::cudaDataType::CUDA_R_32F;
}

impl Gpu {
    /// `g`'s product on cuBLAS: a, b bf16; c bf16 or f32; fp32 accumulation. Every operand's
    /// length is checked against the rows the product reads or writes.
    pub fn gemm<C: GemmOut>(&self, g: Gemm, a: &impl DevicePtr<bf16>, b: &impl DevicePtr<bf16>, c: &mut impl DevicePtrMut<C>) -> Result<()> {
        let Gemm { m, n, k, a_t, b_t, alpha, beta, .. } = g;
        let [(ar, ac), (br, bc)] = g.stored_shapes();
        let [lda, ldb, ldc] = g.leading_dims();
        let need = |rows: usize, cols: usize, ld: usize| if rows == 0 || cols == 0 { 0 } else { (rows - 1) * ld + cols };
        if lda < ac || ldb < bc || ldc < n {
            return Err(crate::Error(format!("gemm: leading dimensions {lda}, {ldb}, {ldc} below the rows' lengths {ac}, {bc}, {n}")));
        }
        check_len("gemm a", a.len(), need(ar, ac, lda))?;
        check_len("gemm b", b.len(), need(br, bc, ldb))?;
        check_len("gemm c", c.len(), need(m, n, ldc))?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        // Row-major C = A' B'  <=>  column-major Cᵀ = B'ᵀ A'ᵀ: cuBLAS's "A" is our b, its "B" our a.
        use blas_sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        let op_b = if b_t { CUBLAS_OP_T } else { CUBLAS_OP_N };
        let op_a = if a_t { CUBLAS_OP_T } else { CUBLAS_OP_N };
        let (ap, _ga) = a.device_ptr(&self.stream);
        let (bp, _gb) = b.device_ptr(&self.stream);
        let (cp, _gc) = c.device_ptr_mut(&self.stream);
        // SAFETY: lengths checked above against the m, n, k and leading dimensions the call describes.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                op_b,
                op_a,
                i32_of("n", n)?,
                i32_of("m", m)?,
                i32_of("k", k)?,
                (&alpha) as *const f32 as *const _,
                bp as *const _,
                blas_sys::cudaDataType::CUDA_R_16BF,
                i32_of("ldb", ldb)?,
                ap as *const _,
                blas_sys::cudaDataType::CUDA_R_16BF,
                i32_of("lda", lda)?,
                (&beta) as *const f32 as *const _,
                cp as *mut _,
                C::DTYPE,
                i32_of("ldc", ldc)?,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )?;
        }
        Ok(())
    }
}

/// One linear layer of a model: w [O, I] at `w` of the flat bf16 weight buffer, its bias [O] at
/// `bias` if it has one (llama `attention_bias` / `mlp_bias`), applied to `rows` rows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Linear {
    pub w: usize,
    pub bias: Option<usize>,
    /// (T, I, O): rows, input and output features.
    pub shape: (usize, usize, usize),
}

/// What every linear layer reads besides its input: the flat bf16 weights and an all-ones vector
/// (at least T long) biases are broadcast and summed through.
#[derive(Clone, Copy)]
pub(crate) struct LinearWeights<'a> {
    pub flat: &'a CudaSlice<bf16>,
    pub ones: &'a CudaSlice<bf16>,
}

/// `y[T, O] = x[T, I] @ w[O, I]ᵀ (+ b[O])`, plus the old `y` when `residual` (the residual stream
/// copied there first). Without a bias, matmul + residual are rounded to bf16 once; with one, the
/// bias is added first and that sum is rounded too.
pub(crate) fn linear_fwd(gpu: &Gpu, ws: LinearWeights, l: Linear, x: &impl DevicePtr<bf16>, y: &mut impl DevicePtrMut<bf16>, residual: bool) -> Result<()> {
    let (t, i, o) = l.shape;
    let mut beta = if residual { 1.0 } else { 0.0 };
    if let Some(b) = l.bias {
        // y (+)= ones[T, 1] @ b[1, O]: the bias broadcast through cuBLAS (k = 1).
        gpu.gemm(Gemm::new(t, o, 1).beta(beta), &ws.ones.slice(..t), &ws.flat.slice(b..b + o), y)?;
        beta = 1.0;
    }
    gpu.gemm(Gemm::new(t, o, i).transposed(false, true).beta(beta), x, &ws.flat.slice(l.w..l.w + o * i), y)
}

/// Backward of [`linear_fwd`]: `dx[T, I] = dy[T, O] @ w[O, I]` (written), `dw[O, I] += dyᵀ @ x`
/// and `db[O] += ones[1, T] @ dy` into the f32 gradient buffer at the weights' offsets (none
/// without one: frozen weights under LoRA).
pub(crate) fn linear_bwd(
    gpu: &Gpu,
    ws: LinearWeights,
    l: Linear,
    dy: &impl DevicePtr<bf16>,
    x: &impl DevicePtr<bf16>,
    dx: &mut impl DevicePtrMut<bf16>,
    grad: Option<&mut CudaSlice<f32>>,
) -> Result<()> {
    let (t, i, o) = l.shape;
    let wr = l.w..l.w + o * i;
    gpu.gemm(Gemm::new(t, i, o), dy, &ws.flat.slice(wr.clone()), dx)?;
    let Some(grad) = grad else { return Ok(()) };
    gpu.gemm(Gemm::new(o, i, t).transposed(true, false).beta(1.0), dy, x, &mut grad.slice_mut(wr))?;
    if let Some(b) = l.bias {
        gpu.gemm(Gemm::new(1, o, t).beta(1.0), &ws.ones.slice(..t), dy, &mut grad.slice_mut(b..b + o))?;
    }
    Ok(())
}

//! Matmuls on cuBLAS (`cublasGemmEx`, bf16 in, bf16 or f32 out, fp32 compute) in the row-major
//! convention of the CPU reference `coa_model::ops::gemm`, and the linear layer built on them
//! (forward, and backward into the f32 gradient buffer; biases through k = 1 products with a ones
//! vector). Test: `tests/gpu_kernels/gemm.rs`.

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
    /// `c[m,n] = alpha * a' @ b' + beta * c` in row-major terms, the convention of
    /// `coa_model::ops::gemm`: a' = a (stored [m,k]) or aᵀ (a stored [k,m], `a_t`); b' = b (stored
    /// [k,n]) or bᵀ (b stored [n,k], `b_t`). a, b bf16; c bf16 or f32; fp32 accumulation.
    /// Linear forward `y = x @ wᵀ` is `gemm(T, O, I, x, false, w, true, y, 1, 0)`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm<C: GemmOut>(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &impl DevicePtr<bf16>,
        a_t: bool,
        b: &impl DevicePtr<bf16>,
        b_t: bool,
        c: &mut impl DevicePtrMut<C>,
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        let (lda, ldb) = (if a_t { m } else { k }, if b_t { k } else { n });
        self.gemm_ld(m, n, k, a, a_t, lda, b, b_t, ldb, c, n, alpha, beta)
    }

    /// [`Gpu::gemm`] on sub-matrices: the stored rows of a, b and c are `lda`, `ldb`, `ldc`
    /// elements apart (row-major leading dimensions), e.g. a column block of a fused q|k|v buffer
    /// (LoRA's updates and gradients of q, k or v alone).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_ld<C: GemmOut>(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &impl DevicePtr<bf16>,
        a_t: bool,
        lda: usize,
        b: &impl DevicePtr<bf16>,
        b_t: bool,
        ldb: usize,
        c: &mut impl DevicePtrMut<C>,
        ldc: usize,
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        // (stored rows, stored columns) of each operand
        let (ar, ac) = if a_t { (k, m) } else { (m, k) };
        let (br, bc) = if b_t { (n, k) } else { (k, n) };
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
        let (ldb_, lda_) = (ldb, lda);
        let (ap, _ga) = a.device_ptr(&self.stream);
        let (bp, _gb) = b.device_ptr(&self.stream);
        let (cp, _gc) = c.device_ptr_mut(&self.stream);
        // SAFETY: lengths checked above against the m, n, k the call describes.
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
                i32_of("ldb", ldb_)?,
                ap as *const _,
                blas_sys::cudaDataType::CUDA_R_16BF,
                i32_of("lda", lda_)?,
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

/// `y[T, O] = x[T, I] @ w[O, I]ᵀ (+ b[O])`, plus the old `y` when `residual` (the residual stream
/// copied there first). Without a bias, matmul + residual are rounded to bf16 once; with one
/// (llama `attention_bias` / `mlp_bias` on o_proj / down_proj), the bias is added first and that
/// sum is rounded too. Weights at `w_off` / `b_off` of the flat bf16 buffer.
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear_fwd(
    gpu: &Gpu,
    x: &impl DevicePtr<bf16>,
    w: &CudaSlice<bf16>,
    w_off: usize,
    b_off: Option<usize>,
    y: &mut impl DevicePtrMut<bf16>,
    ones: &CudaSlice<bf16>,
    (t, i, o): (usize, usize, usize),
    residual: bool,
) -> Result<()> {
    let mut beta = if residual { 1.0 } else { 0.0 };
    if let Some(b) = b_off {
        // y (+)= ones[T, 1] @ b[1, O]: the bias broadcast through cuBLAS (k = 1).
        gpu.gemm(t, o, 1, &ones.slice(..t), false, &w.slice(b..b + o), false, y, 1.0, beta)?;
        beta = 1.0;
    }
    gpu.gemm(t, o, i, x, false, &w.slice(w_off..w_off + o * i), true, y, 1.0, beta)
}

/// Backward of [`linear_fwd`]: `dx[T, I] = dy[T, O] @ w[O, I]` (written), `dw[O, I] += dyᵀ @ x`
/// and `db[O] += ones[1, T] @ dy` into the f32 gradient buffer at the weights' offsets (none
/// without one: frozen weights under LoRA).
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear_bwd(
    gpu: &Gpu,
    dy: &impl DevicePtr<bf16>,
    x: &impl DevicePtr<bf16>,
    w: &CudaSlice<bf16>,
    w_off: usize,
    b_off: Option<usize>,
    dx: &mut impl DevicePtrMut<bf16>,
    grad: Option<&mut CudaSlice<f32>>,
    ones: &CudaSlice<bf16>,
    (t, i, o): (usize, usize, usize),
) -> Result<()> {
    let wr = w_off..w_off + o * i;
    gpu.gemm(t, i, o, dy, false, &w.slice(wr.clone()), false, dx, 1.0, 0.0)?;
    let Some(grad) = grad else { return Ok(()) };
    gpu.gemm(o, i, t, dy, true, x, false, &mut grad.slice_mut(wr), 1.0, 1.0)?;
    if let Some(b) = b_off {
        gpu.gemm(1, o, t, &ones.slice(..t), false, dy, false, &mut grad.slice_mut(b..b + o), 1.0, 1.0)?;
    }
    Ok(())
}

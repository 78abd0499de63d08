//! Host compute: matrices that live on the host's device (a GPU, or the
//! host's CPU at native speed) and the kernels a model needs, charged in
//! fuel by the work they do rather than per wasm instruction.
//!
//! A [`Tensor`] is a row-major `rows x cols` matrix of `f32` held by the
//! host; dropping it frees the device memory. Host snapshots carry tensors,
//! so a trainable that keeps its weights in tensors can still be paused,
//! cloned and resumed without writing `save()`. A guest-written `save()`
//! must read its tensors back ([`Tensor::to_vec`]) and `restore()` upload
//! them again: only host snapshots see the host's buffers.
//!
//! ```no_run
//! use wtune_guest::compute::{Tensor, Unary};
//!
//! # fn main() -> Result<(), wtune_guest::compute::ComputeError> {
//! // A dense layer: y = relu(x * w + b) for a batch of 2 inputs.
//! let x = Tensor::from_rows(2, 3, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])?;
//! let w = Tensor::from_rows(3, 2, &[0.1, 0.2, 0.3, 0.4, 0.5, 0.6])?;
//! let b = Tensor::from_rows(1, 2, &[0.0, -10.0])?;
//! let mut y = x.matmul(&w)?;
//! y.add_row(&b)?;
//! y.map_in_place(Unary::Relu)?;
//! assert_eq!(y.to_vec()?.len(), 4);
//! # Ok(()) }
//! ```
//!
//! Every call checks its shapes on the guest side first, so a mistake
//! reads as `matmul: 2x3 times 2x2 ...` rather than as a buffer size; the
//! host checks again, so nothing a guest passes can hurt it.

/// The interface's functions as generated from the WIT, for what the
/// wrappers below do not cover (byte buffers for shaders, offsets).
pub use crate::bindings::wtune::trainable::compute as raw;

pub use raw::{
    Axis, BackendInfo, BinaryOp as Binary, ComputeError, ReduceOp as Reduce, UnaryOp as Unary,
};

/// `Result` with [`ComputeError`].
pub type Result<T, E = ComputeError> = std::result::Result<T, E>;

// `ComputeError` implements Display and Error (generated): `?` turns it into
// a `wtune_guest::Error` whose message names the case and the host's reason.

/// Where the host computes and how much this trial may hold.
///
/// ```no_run
/// let backend = wtune_guest::compute::info();
/// // "gpu" or "cpu"; custom shaders only where `shaders` is true.
/// if backend.shaders {
///     println!("computing on {} ({} bytes allowed)", backend.name, backend.quota_bytes);
/// }
/// ```
pub fn info() -> BackendInfo {
    raw::info()
}

fn invalid(message: String) -> ComputeError {
    ComputeError::Invalid(message)
}

/// A row-major `rows x cols` matrix of `f32` on the host's device.
///
/// ```no_run
/// use wtune_guest::compute::{Axis, Reduce, Tensor};
///
/// # fn main() -> wtune_guest::compute::Result<()> {
/// let batch = Tensor::from_rows(2, 2, &[1.0, 2.0, 3.0, 4.0])?;
/// // Column sums over the batch: a 1 x 2 matrix.
/// let sums = batch.reduce(Reduce::Sum, Axis::Cols)?;
/// assert_eq!(sums.to_vec()?, [4.0, 6.0]);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Tensor {
    id: u32,
    rows: u32,
    cols: u32,
}

impl Tensor {
    /// A zero-filled matrix. One larger than the backend's largest buffer
    /// ([`BackendInfo::max_buffer_bytes`]) or the trial's quota is refused.
    ///
    /// ```no_run
    /// # fn main() -> wtune_guest::compute::Result<()> {
    /// let grad = wtune_guest::compute::Tensor::zeros(784, 128)?;
    /// assert_eq!(grad.len(), 784 * 128);
    /// # Ok(()) }
    /// ```
    pub fn zeros(rows: u32, cols: u32) -> Result<Self> {
        let bytes = (rows as u64)
            .checked_mul(cols as u64)
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(|| invalid(format!("zeros: a {rows}x{cols} matrix is too large")))?;
        let id = raw::create_buffer(bytes)?;
        Ok(Self { id, rows, cols })
    }

    /// A matrix holding `data`, row after row.
    pub fn from_rows(rows: u32, cols: u32, data: &[f32]) -> Result<Self> {
        if data.len() as u64 != rows as u64 * cols as u64 {
            return Err(invalid(format!(
                "from_rows: {} values for a {rows}x{cols} matrix",
                data.len()
            )));
        }
        let id = raw::upload_f32(data)?;
        Ok(Self { id, rows, cols })
    }

    /// Rows.
    pub fn rows(&self) -> u32 {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> u32 {
        self.cols
    }

    /// Elements (`rows * cols`).
    pub fn len(&self) -> u64 {
        self.rows as u64 * self.cols as u64
    }

    /// Whether the matrix has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The host's number for the buffer, for [`Pipeline::dispatch`].
    pub fn buffer(&self) -> u32 {
        self.id
    }

    /// Reads the whole matrix back, row after row.
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        raw::read_f32(self.id, 0, self.len())
    }

    /// Reads rows `start..start + count`.
    pub fn read_rows(&self, start: u32, count: u32) -> Result<Vec<f32>> {
        raw::read_f32(
            self.id,
            start as u64 * self.cols as u64,
            count as u64 * self.cols as u64,
        )
    }

    /// Overwrites the whole matrix.
    pub fn write(&mut self, data: &[f32]) -> Result<()> {
        if data.len() as u64 != self.len() {
            return Err(invalid(format!(
                "write: {} values into a {}x{} matrix",
                data.len(),
                self.rows,
                self.cols
            )));
        }
        raw::write_f32(self.id, 0, data)
    }

    /// Overwrites rows from `start` on with `data` (whole rows).
    pub fn write_rows(&mut self, start: u32, data: &[f32]) -> Result<()> {
        raw::write_f32(self.id, start as u64 * self.cols as u64, data)
    }

    /// A copy on the device.
    pub fn try_clone(&self) -> Result<Self> {
        let copy = Self::zeros(self.rows, self.cols)?;
        raw::copy(self.id, 0, copy.id, 0, self.len())?;
        Ok(copy)
    }

    /// `self * other`.
    ///
    /// ```no_run
    /// use wtune_guest::compute::Tensor;
    ///
    /// # fn main() -> wtune_guest::compute::Result<()> {
    /// let a = Tensor::from_rows(1, 2, &[1.0, 2.0])?;
    /// let b = Tensor::from_rows(2, 1, &[3.0, 4.0])?;
    /// assert_eq!(a.matmul(&b)?.to_vec()?, [11.0]);
    /// // Shapes are checked before the host is asked.
    /// assert!(a.matmul(&a).is_err());
    /// # Ok(()) }
    /// ```
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        let mut out = Tensor::zeros(self.rows, other.cols)?;
        gemm(&mut out, self, false, other, false, 1.0, 0.0)?;
        Ok(out)
    }

    /// `op(x)` for each element, as a new matrix.
    pub fn map(&self, op: Unary) -> Result<Tensor> {
        let out = Tensor::zeros(self.rows, self.cols)?;
        raw::unary(op, self.id, out.id, self.len())?;
        Ok(out)
    }

    /// `x = op(x)` for each element.
    pub fn map_in_place(&mut self, op: Unary) -> Result<()> {
        raw::unary(op, self.id, self.id, self.len())
    }

    /// `op(self, other)` element by element, as a new matrix.
    pub fn zip(&self, op: Binary, other: &Tensor) -> Result<Tensor> {
        self.same_shape("zip", other)?;
        let out = Tensor::zeros(self.rows, self.cols)?;
        raw::binary(op, self.id, other.id, out.id, self.len())?;
        Ok(out)
    }

    /// `self = op(self, other)` element by element.
    pub fn zip_in_place(&mut self, op: Binary, other: &Tensor) -> Result<()> {
        self.same_shape("zip_in_place", other)?;
        raw::binary(op, self.id, other.id, self.id, self.len())
    }

    /// Adds the `1 x cols` matrix `row` to every row (a bias).
    pub fn add_row(&mut self, row: &Tensor) -> Result<()> {
        self.row_op(Binary::Add, row)
    }

    /// `self[r, c] = op(self[r, c], row[c])` for every row.
    pub fn row_op(&mut self, op: Binary, row: &Tensor) -> Result<()> {
        if row.len() != self.cols as u64 {
            return Err(invalid(format!(
                "row_op: a row of {} values for {} columns",
                row.len(),
                self.cols
            )));
        }
        raw::binary_rows(op, self.id, row.id, self.id, self.rows, self.cols)
    }

    /// `self = self * scale + shift`.
    pub fn affine_in_place(&mut self, scale: f32, shift: f32) -> Result<()> {
        raw::affine(self.id, self.id, self.len(), scale, shift)
    }

    /// `self += alpha * x` (an SGD step: `w.axpy(-lr, &grad)`).
    ///
    /// ```no_run
    /// use wtune_guest::compute::Tensor;
    ///
    /// # fn main() -> wtune_guest::compute::Result<()> {
    /// let mut w = Tensor::from_rows(1, 2, &[1.0, 1.0])?;
    /// let grad = Tensor::from_rows(1, 2, &[0.5, -0.5])?;
    /// w.axpy(-0.1, &grad)?;
    /// assert_eq!(w.to_vec()?, [0.95, 1.05]);
    /// # Ok(()) }
    /// ```
    pub fn axpy(&mut self, alpha: f32, x: &Tensor) -> Result<()> {
        self.same_shape("axpy", x)?;
        raw::axpy(alpha, x.id, self.id, self.len())
    }

    /// Reduces along `along`: [`Axis::Rows`] gives a `rows x 1` matrix,
    /// [`Axis::Cols`] a `1 x cols` one (the sum over a batch, say).
    pub fn reduce(&self, op: Reduce, along: Axis) -> Result<Tensor> {
        let (rows, cols) = match along {
            Axis::Rows => (self.rows, 1),
            Axis::Cols => (1, self.cols),
        };
        let out = Tensor::zeros(rows, cols)?;
        raw::reduce(op, along, self.id, out.id, self.rows, self.cols)?;
        Ok(out)
    }

    /// Softmax of each row, in place (stable: each row's maximum is
    /// subtracted first).
    ///
    /// ```no_run
    /// use wtune_guest::compute::Tensor;
    ///
    /// # fn main() -> wtune_guest::compute::Result<()> {
    /// let mut logits = Tensor::from_rows(1, 2, &[0.0, 0.0])?;
    /// logits.softmax_rows()?;
    /// assert_eq!(logits.to_vec()?, [0.5, 0.5]);
    /// # Ok(()) }
    /// ```
    pub fn softmax_rows(&mut self) -> Result<()> {
        raw::softmax(self.id, self.id, self.rows, self.cols)
    }

    fn same_shape(&self, what: &str, other: &Tensor) -> Result<()> {
        if (self.rows, self.cols) != (other.rows, other.cols) {
            return Err(invalid(format!(
                "{what}: a {}x{} matrix and a {}x{} one",
                self.rows, self.cols, other.rows, other.cols
            )));
        }
        Ok(())
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        // Freeing only fails for a number the trial does not hold, which a
        // Tensor never has; nothing useful can be done with an error here.
        let _ = raw::free(self.id);
    }
}

/// `out = alpha * op(a) * op(b) + beta * out`, where `op` transposes when
/// asked: the workhorse of backpropagation (`grad_w = x^T * grad_y` is
/// `gemm(&mut gw, &x, true, &gy, false, 1.0, 0.0)`).
///
/// ```no_run
/// use wtune_guest::compute::{Tensor, gemm};
///
/// # fn main() -> wtune_guest::compute::Result<()> {
/// // A batch of 2 inputs with 3 features, and the gradient at a 3 -> 1 layer.
/// let x = Tensor::from_rows(2, 3, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])?;
/// let grad_y = Tensor::from_rows(2, 1, &[1.0, -1.0])?;
/// let mut grad_w = Tensor::zeros(3, 1)?;
/// // grad_w = x^T * grad_y, without materialising x^T.
/// gemm(&mut grad_w, &x, true, &grad_y, false, 1.0, 0.0)?;
/// assert_eq!(grad_w.to_vec()?, [-3.0, -3.0, -3.0]);
/// # Ok(()) }
/// ```
pub fn gemm(
    out: &mut Tensor,
    a: &Tensor,
    transpose_a: bool,
    b: &Tensor,
    transpose_b: bool,
    alpha: f32,
    beta: f32,
) -> Result<()> {
    let (m, k) = if transpose_a {
        (a.cols, a.rows)
    } else {
        (a.rows, a.cols)
    };
    let (k2, n) = if transpose_b {
        (b.cols, b.rows)
    } else {
        (b.rows, b.cols)
    };
    if k != k2 || (out.rows, out.cols) != (m, n) {
        let t = |yes: bool| if yes { "^T" } else { "" };
        return Err(invalid(format!(
            "gemm: {}x{}{} times {}x{}{} does not give the {}x{} output",
            a.rows,
            a.cols,
            t(transpose_a),
            b.rows,
            b.cols,
            t(transpose_b),
            out.rows,
            out.cols
        )));
    }
    let spec = raw::MatmulSpec {
        m,
        n,
        k,
        transpose_a,
        transpose_b,
        alpha,
        beta,
    };
    raw::matmul(a.id, b.id, out.id, spec)
}

/// A compiled WGSL compute shader (GPU backends; see
/// [`BackendInfo::shaders`]).
///
/// ```no_run
/// use wtune_guest::compute::{Pipeline, Tensor};
///
/// const DOUBLE: &str = "
/// @group(0) @binding(0) var<storage, read_write> x: array<f32>;
/// @compute @workgroup_size(64)
/// fn main(@builtin(global_invocation_id) id: vec3<u32>) {
///     if (id.x < arrayLength(&x)) { x[id.x] = x[id.x] * 2.0; }
/// }";
///
/// # fn main() -> wtune_guest::compute::Result<()> {
/// let x = Tensor::from_rows(1, 100, &[1.0; 100])?;
/// let double = Pipeline::new(DOUBLE, "main")?;
/// // 2 workgroups of 64 invocations cover the 100 elements.
/// double.dispatch(&[&x], [2, 1, 1])?;
/// assert_eq!(x.to_vec()?, [2.0; 100]);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Pipeline {
    id: u32,
}

impl Pipeline {
    /// Compiles `wgsl`'s `entry_point`. Errors name the line and column.
    pub fn new(wgsl: &str, entry_point: &str) -> Result<Self> {
        Ok(Self {
            id: raw::create_pipeline(wgsl, entry_point)?,
        })
    }

    /// Runs over `groups` workgroups with `buffers` bound as
    /// `@group(0) @binding(0..)`.
    pub fn dispatch(&self, buffers: &[&Tensor], groups: [u32; 3]) -> Result<()> {
        let ids: Vec<u32> = buffers.iter().map(|t| t.id).collect();
        raw::dispatch(self.id, &ids, (groups[0], groups[1], groups[2]))
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        let _ = raw::free_pipeline(self.id);
    }
}

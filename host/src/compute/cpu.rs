//! The native CPU kernels. Shapes are checked by the caller
//! ([`super::ComputeSession`]); these only compute.
//!
//! Matrix products go through `matrixmultiply`'s blocked, SIMD `sgemm`,
//! threaded over up to 4 physical cores (its `MATMUL_NUM_THREADS` caps it
//! lower). Transposes are strides, never copies. Element-wise kernels are
//! plain loops the compiler vectorizes.

use super::ops::{Axis, Binary, Matmul, Reduce, Unary};

/// `out = alpha * op(a) * op(b) + beta * out`. With `beta == 0`, `out` is
/// not read (NaNs in it do not leak into the result), as in BLAS.
pub fn matmul(a: &[f32], b: &[f32], out: &mut [f32], spec: &Matmul) {
    let (m, n, k) = (spec.m as usize, spec.n as usize, spec.k as usize);
    let out = &mut out[..m * n];
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // An empty sum: only the beta term is left.
        scale(out, spec.beta);
        return;
    }
    let (rsa, csa) = if spec.transpose_a { (1, m) } else { (k, 1) };
    let (rsb, csb) = if spec.transpose_b { (1, k) } else { (n, 1) };
    assert!(
        a.len() >= m * k && b.len() >= k * n,
        "operand shapes are checked by the session"
    );
    // SAFETY: the caller checked that `a` holds m*k elements and `b` k*n,
    // and the strides above address exactly those; `out` is m*n elements,
    // a separate buffer (the session refuses aliasing), with strides (n, 1)
    // that never alias.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            spec.alpha,
            a.as_ptr(),
            rsa as isize,
            csa as isize,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            spec.beta,
            out.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// `out *= beta`, where `beta == 0` clears (even NaNs).
fn scale(out: &mut [f32], beta: f32) {
    if beta == 0.0 {
        out.fill(0.0);
    } else {
        out.iter_mut().for_each(|v| *v *= beta);
    }
}

/// `out[i] = op(x[i])`; `x` is `None` when `out` is `x`.
pub fn unary(op: Unary, x: Option<&[f32]>, out: &mut [f32]) {
    match x {
        Some(x) => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = op.apply(v);
            }
        }
        None => {
            for v in out {
                *v = op.apply(*v);
            }
        }
    }
}

/// The inputs of a two-input kernel whose output may be one of them.
pub enum Operands<'a> {
    /// `out` is a third buffer.
    Both(&'a [f32], &'a [f32]),
    /// `out` is `a`; this is `b`.
    OutIsA(&'a [f32]),
    /// `out` is `b`; this is `a`.
    OutIsB(&'a [f32]),
    /// `out` is both `a` and `b`.
    OutIsBoth,
}

/// `out[i] = op(a[i], b[i])` for `out.len()` elements.
pub fn binary(op: Binary, operands: Operands<'_>, out: &mut [f32]) {
    match operands {
        Operands::Both(a, b) => {
            for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                *o = op.apply(x, y);
            }
        }
        Operands::OutIsA(b) => {
            for (o, &y) in out.iter_mut().zip(b) {
                *o = op.apply(*o, y);
            }
        }
        Operands::OutIsB(a) => {
            for (o, &x) in out.iter_mut().zip(a) {
                *o = op.apply(x, *o);
            }
        }
        Operands::OutIsBoth => {
            for o in out.iter_mut() {
                *o = op.apply(*o, *o);
            }
        }
    }
}

/// `out[r, c] = op(x[r, c], row[c])`; `x` is `None` when `out` is `x`.
pub fn binary_rows(op: Binary, x: Option<&[f32]>, row: &[f32], out: &mut [f32], cols: usize) {
    if cols == 0 {
        return;
    }
    let row = &row[..cols];
    match x {
        Some(x) => {
            for (o, x) in out.chunks_exact_mut(cols).zip(x.chunks_exact(cols)) {
                for ((o, &v), &r) in o.iter_mut().zip(x).zip(row) {
                    *o = op.apply(v, r);
                }
            }
        }
        None => {
            for o in out.chunks_exact_mut(cols) {
                for (o, &r) in o.iter_mut().zip(row) {
                    *o = op.apply(*o, r);
                }
            }
        }
    }
}

/// `out[i] = x[i] * scale + shift`; `x` is `None` when `out` is `x`.
pub fn affine(x: Option<&[f32]>, out: &mut [f32], scale: f32, shift: f32) {
    match x {
        Some(x) => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v * scale + shift;
            }
        }
        None => {
            for o in out {
                *o = *o * scale + shift;
            }
        }
    }
}

/// `y[i] += alpha * x[i]`; `x` is `None` when it is `y`.
pub fn axpy(alpha: f32, x: Option<&[f32]>, y: &mut [f32]) {
    match x {
        Some(x) => {
            for (y, &x) in y.iter_mut().zip(x) {
                *y += alpha * x;
            }
        }
        None => {
            for y in y {
                *y += alpha * *y;
            }
        }
    }
}

/// Reduces a row-major `rows x cols` matrix into `out` (`rows` or `cols`
/// results). `out` is a separate buffer. Max and min of an empty line are
/// -inf and +inf, a mean of none is NaN, as the definitions give.
pub fn reduce(op: Reduce, along: Axis, x: &[f32], out: &mut [f32], rows: usize, cols: usize) {
    let init = match op {
        Reduce::Sum | Reduce::Mean => 0.0,
        Reduce::Max => f32::NEG_INFINITY,
        Reduce::Min => f32::INFINITY,
    };
    let fold = |acc: f32, v: f32| match op {
        Reduce::Sum | Reduce::Mean => acc + v,
        Reduce::Max => acc.max(v),
        Reduce::Min => acc.min(v),
    };
    let x = &x[..rows * cols];
    let count = match along {
        Axis::Rows => {
            let out = &mut out[..rows];
            if cols == 0 {
                out.fill(init);
            } else {
                for (o, line) in out.iter_mut().zip(x.chunks_exact(cols)) {
                    *o = line.iter().fold(init, |acc, &v| fold(acc, v));
                }
            }
            cols
        }
        Axis::Cols => {
            // Row by row, so the matrix is read in order.
            let out = &mut out[..cols];
            out.fill(init);
            if cols > 0 {
                for line in x.chunks_exact(cols) {
                    for (o, &v) in out.iter_mut().zip(line) {
                        *o = fold(*o, v);
                    }
                }
            }
            rows
        }
    };
    if op == Reduce::Mean {
        let results = match along {
            Axis::Rows => rows,
            Axis::Cols => cols,
        };
        let inv = 1.0 / count as f32;
        out[..results].iter_mut().for_each(|v| *v *= inv);
    }
}

/// Row-wise softmax in place; each row's maximum is subtracted first so
/// large logits do not overflow.
pub fn softmax_in_place(out: &mut [f32], cols: usize) {
    if cols == 0 {
        return;
    }
    for row in out.chunks_exact_mut(cols) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for v in row.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        row.iter_mut().for_each(|v| *v *= inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, one dot product at a time.
    fn reference(a: &[f32], b: &[f32], c: &[f32], s: &Matmul) -> Vec<f32> {
        let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
        let at = |i: usize, p: usize| {
            if s.transpose_a {
                a[p * m + i]
            } else {
                a[i * k + p]
            }
        };
        let bt = |p: usize, j: usize| {
            if s.transpose_b {
                b[j * k + p]
            } else {
                b[p * n + j]
            }
        };
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let dot: f64 = (0..k).map(|p| at(i, p) as f64 * bt(p, j) as f64).sum();
                let prior = if s.beta == 0.0 {
                    0.0
                } else {
                    s.beta * c[i * n + j]
                };
                out[i * n + j] = s.alpha * dot as f32 + prior;
            }
        }
        out
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn matmul_matches_the_definition_for_every_transpose() {
        for (m, n, k) in [(1, 1, 1), (3, 5, 7), (17, 9, 33), (64, 48, 80)] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                for (alpha, beta) in [(1.0, 0.0), (0.5, 1.0), (-2.0, 0.25)] {
                    let spec = Matmul {
                        m,
                        n,
                        k,
                        transpose_a: ta,
                        transpose_b: tb,
                        alpha,
                        beta,
                    };
                    let (mu, nu, ku) = (m as usize, n as usize, k as usize);
                    let a = values(mu * ku, 1);
                    let b = values(ku * nu, 2);
                    let c = values(mu * nu, 3);
                    let mut out = c.clone();
                    matmul(&a, &b, &mut out, &spec);
                    let want = reference(&a, &b, &c, &spec);
                    for (got, want) in out.iter().zip(&want) {
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{spec:?}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn beta_zero_ignores_nan_in_the_output_and_k_zero_scales_it() {
        let spec = Matmul {
            m: 2,
            n: 2,
            k: 1,
            transpose_a: false,
            transpose_b: false,
            alpha: 1.0,
            beta: 0.0,
        };
        let mut out = vec![f32::NAN; 4];
        matmul(&[1.0, 2.0], &[3.0, 4.0], &mut out, &spec);
        assert_eq!(out, [3.0, 4.0, 6.0, 8.0]);
        let spec = Matmul {
            k: 0,
            beta: 0.5,
            ..spec
        };
        matmul(&[], &[], &mut out, &spec);
        assert_eq!(out, [1.5, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn element_wise_kernels_handle_aliasing() {
        let a = [1.0, -2.0, 3.0];
        let b = [4.0, 5.0, -6.0];
        let mut out = [0.0; 3];
        binary(Binary::Sub, Operands::Both(&a, &b), &mut out);
        assert_eq!(out, [-3.0, -7.0, 9.0]);
        let mut x = a;
        binary(Binary::Mul, Operands::OutIsA(&b), &mut x);
        assert_eq!(x, [4.0, -10.0, -18.0]);
        let mut y = b;
        binary(Binary::ReluBackward, Operands::OutIsB(&a), &mut y);
        // out = a where b > 0
        assert_eq!(y, [1.0, -2.0, 0.0]);
        let mut z = a;
        binary(Binary::Add, Operands::OutIsBoth, &mut z);
        assert_eq!(z, [2.0, -4.0, 6.0]);
        let mut r = a;
        unary(Unary::Relu, None, &mut r);
        assert_eq!(r, [1.0, 0.0, 3.0]);
        let mut s = [0.0; 3];
        unary(Unary::Square, Some(&a), &mut s);
        assert_eq!(s, [1.0, 4.0, 9.0]);
        let mut y = [1.0, 1.0, 1.0];
        axpy(-0.5, Some(&a), &mut y);
        assert_eq!(y, [0.5, 2.0, -0.5]);
        let mut t = a;
        affine(None, &mut t, 2.0, 1.0);
        assert_eq!(t, [3.0, -3.0, 7.0]);
    }

    #[test]
    fn row_broadcast_reductions_and_softmax() {
        // 2 x 3
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut out = [0.0; 6];
        binary_rows(Binary::Add, Some(&x), &[10.0, 20.0, 30.0], &mut out, 3);
        assert_eq!(out, [11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
        let mut sums = [0.0; 3];
        reduce(Reduce::Sum, Axis::Cols, &x, &mut sums, 2, 3);
        assert_eq!(sums, [5.0, 7.0, 9.0]);
        let mut means = [0.0; 2];
        reduce(Reduce::Mean, Axis::Rows, &x, &mut means, 2, 3);
        assert_eq!(means, [2.0, 5.0]);
        let mut maxes = [0.0; 2];
        reduce(Reduce::Max, Axis::Rows, &x, &mut maxes, 2, 3);
        assert_eq!(maxes, [3.0, 6.0]);
        let mut mins = [0.0; 3];
        reduce(Reduce::Min, Axis::Cols, &x, &mut mins, 2, 3);
        assert_eq!(mins, [1.0, 2.0, 3.0]);

        let mut p = [1000.0, 1001.0, 1002.0, 0.0, 0.0, 0.0];
        softmax_in_place(&mut p, 3);
        let e = [(-2.0f32).exp(), (-1.0f32).exp(), 1.0];
        let total: f32 = e.iter().sum();
        for (got, want) in p[..3].iter().zip(e.iter().map(|v| v / total)) {
            assert!((got - want).abs() < 1e-6);
        }
        for v in &p[3..] {
            assert!((v - 1.0 / 3.0).abs() < 1e-6);
        }
    }
}

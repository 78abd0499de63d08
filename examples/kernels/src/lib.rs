//! A trainable that drives the host `compute` interface, for the host's
//! tests and benchmarks.
//!
//! ```json
//! {"seed": 1, "width": 256, "iterations": 5, "check": true,
//!  "matmul": 0, "misuse": "none"}
//! ```
//!
//! - Every `train()` advances a walk whose whole state lives in host
//!   tensors (`state = tanh(state * W + b)`, a `1 x width` row through a
//!   `width x width` layer), and reports `walk` (the state's sum) and
//!   `walk_head` (its first value). A host snapshot that loses a tensor, or
//!   a restore that mixes them up, changes both.
//! - `check`: in the first call, runs every kernel on fixed data and
//!   reports `err_<kernel>`, the largest difference from a plain Rust
//!   reference computed here in wasm.
//! - `matmul`: setup makes an `n x n` matrix; every call then squares it
//!   `repeat` times, through the interface, or in plain wasm with
//!   `in_wasm` (the comparison the benchmarks make).
//! - `tiny`: every call also makes that many one-element kernel calls (the
//!   interface's per-call cost); with `tiny_read`, each is followed by a
//!   read of its one element (the cost of a call that waits for the GPU).
//! - `misuse`: in the first call, does something the host must refuse and
//!   returns the host's error as the trial's error: `freed` (uses a freed
//!   tensor), `quota` (allocates until refused), `huge` (one enormous
//!   buffer), `outside` (reads past a buffer's end), `shader` (asks for a
//!   custom shader), `shape` (a matmul whose output is too small),
//!   `refused_writes` (1 GiB, in 4 MiB writes to a buffer that does not
//!   exist, each refused), `big_read` (all of a 64 MiB buffer in one read,
//!   which a guest limited to less memory cannot hold); and on a
//!   GPU backend `tile` (a matmul output taller than the GPU's grid of
//!   tiles), `bad_wgsl` (WGSL with a type error), `dispatch` (more
//!   workgroups than a dispatch allows), `binding` (a pipeline given the
//!   wrong buffers), `bindings` (more buffers than a dispatch binds),
//!   `entry` (an overlong entry-point name), `override` (a workgroup size
//!   set by an override, which fuel cannot price) and `runaway` (a shader
//!   that runs far past any deadline, so the host must kill its worker).
//! - With `check` on a backend with shaders, a custom WGSL pipeline is
//!   checked too (`err_shader`).

use serde::Deserialize;
use wtune_guest::compute::{self, Axis, Binary, Reduce, Tensor, Unary, gemm, raw};
use wtune_guest::{Error, Report, Result, Trainable};

/// The trial's config (see the crate docs).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default = "one")]
    seed: u64,
    #[serde(default = "default_width")]
    width: u32,
    #[serde(default = "default_iterations")]
    iterations: u64,
    #[serde(default)]
    check: bool,
    #[serde(default)]
    matmul: u32,
    #[serde(default = "one_u32")]
    repeat: u32,
    #[serde(default)]
    in_wasm: bool,
    #[serde(default)]
    tiny: u32,
    #[serde(default)]
    tiny_read: bool,
    #[serde(default = "none")]
    misuse: String,
}

fn one() -> u64 {
    1
}
fn one_u32() -> u32 {
    1
}
fn default_width() -> u32 {
    256
}
fn default_iterations() -> u64 {
    5
}
fn none() -> String {
    "none".into()
}

/// Deterministic values in [-1, 1).
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// The walk's state and layer, all on the host's device.
pub struct Kernels {
    config: Config,
    state: Tensor,
    weights: Tensor,
    bias: Tensor,
    work: Option<Work>,
    calls: u64,
}

/// The `matmul` benchmark's operand and output.
struct Work {
    n: u32,
    a: Tensor,
    out: Tensor,
    /// Guest-memory copies for `in_wasm`.
    plain: Option<(Vec<f32>, Vec<f32>)>,
}

impl Trainable for Kernels {
    type Config = Config;

    fn setup(config: Config) -> Result<Self> {
        let w = config.width;
        if w == 0 || w > 4096 {
            return Err(Error::msg("width must be 1 to 4096"));
        }
        let scale = 1.5 / (w as f32).sqrt();
        let weights: Vec<f32> = values((w * w) as usize, config.seed)
            .into_iter()
            .map(|v| v * scale)
            .collect();
        let work = match config.matmul {
            0 => None,
            n => {
                let data = values((n * n) as usize, 7);
                Some(Work {
                    n,
                    a: Tensor::from_rows(n, n, &data)?,
                    out: Tensor::zeros(n, n)?,
                    plain: config.in_wasm.then(|| (data, vec![0.0; (n * n) as usize])),
                })
            }
        };
        Ok(Kernels {
            work,
            state: Tensor::from_rows(1, w, &values(w as usize, config.seed + 1))?,
            weights: Tensor::from_rows(w, w, &weights)?,
            bias: Tensor::from_rows(1, w, &values(w as usize, config.seed + 2))?,
            config,
            calls: 0,
        })
    }

    fn train(&mut self) -> Result<Report> {
        self.calls += 1;
        let mut report = Report::new();
        if self.calls == 1 {
            misuse(&self.config.misuse)?;
            if self.config.check {
                for (name, err) in check()? {
                    report = report.metric(format!("err_{name}"), err as f64);
                }
                report = report.metric(
                    "backend_is_cpu",
                    (compute::info().kind == "cpu") as u8 as f64,
                );
            }
        }
        if let Some(work) = &mut self.work {
            for _ in 0..self.config.repeat {
                match &mut work.plain {
                    Some((a, out)) => square_in_wasm(a, out, work.n as usize),
                    None => gemm(&mut work.out, &work.a, false, &work.a, false, 1.0, 0.0)?,
                }
            }
            let head = match &work.plain {
                Some((_, out)) => out[0],
                None => work.out.read_rows(0, 1)?[0],
            };
            report = report.metric("matmul_head", head as f64);
        }
        for _ in 0..self.config.tiny {
            raw::unary(Unary::Neg, self.bias.buffer(), self.bias.buffer(), 1)?;
            if self.config.tiny_read {
                raw::read_f32(self.bias.buffer(), 0, 1)?;
            }
        }
        let mut next = self.state.matmul(&self.weights)?;
        next.add_row(&self.bias)?;
        next.map_in_place(Unary::Tanh)?;
        self.state = next;
        let state = self.state.to_vec()?;
        let sum: f64 = state.iter().map(|&v| v as f64).sum();
        Ok(report
            .metric("walk", sum)
            .metric("walk_head", state[0] as f64)
            .done(self.calls >= self.config.iterations))
    }
}

/// `out = a * a` in plain wasm: the i-k-j loop, whose inner loop runs
/// along rows of both operands.
fn square_in_wasm(a: &[f32], out: &mut [f32], n: usize) {
    out.fill(0.0);
    for i in 0..n {
        let row = &mut out[i * n..(i + 1) * n];
        for p in 0..n {
            let x = a[i * n + p];
            for (o, &y) in row.iter_mut().zip(&a[p * n..(p + 1) * n]) {
                *o += x * y;
            }
        }
    }
}

/// Asks the host for something it must refuse, and fails with its answer.
fn misuse(kind: &str) -> Result<()> {
    let refused = match kind {
        "none" => return Ok(()),
        "freed" => {
            let t = Tensor::zeros(1, 4)?;
            let stale = t.buffer();
            drop(t);
            // A stale number, as a use-after-free bug would keep.
            raw::read_f32(stale, 0, 1)
                .err()
                .ok_or_else(|| Error::msg("the host read a freed buffer"))?
        }
        "quota" => {
            let mut held = Vec::new();
            loop {
                match Tensor::zeros(4096, 4096) {
                    Ok(t) => held.push(t),
                    Err(err) => break err,
                }
            }
        }
        "huge" => Tensor::zeros(1 << 20, 1 << 20)
            .err()
            .ok_or_else(|| Error::msg("a 4 TiB buffer was granted"))?,
        "outside" => {
            let t = Tensor::zeros(2, 2)?;
            t.read_rows(1, 2)
                .err()
                .ok_or_else(|| Error::msg("read past the end"))?
        }
        "shader" => compute::Pipeline::new("@compute @workgroup_size(1) fn main() {}", "main")
            .err()
            .ok_or_else(|| Error::msg("a shader compiled"))?,
        "shape" => {
            let a = Tensor::zeros(4, 4)?;
            // The guest-side check is bypassed on purpose: the host must
            // refuse on its own.
            let out = Tensor::zeros(1, 1)?;
            let spec = raw::MatmulSpec {
                m: 4,
                n: 4,
                k: 4,
                transpose_a: false,
                transpose_b: false,
                alpha: 1.0,
                beta: 0.0,
            };
            raw::matmul(a.buffer(), a.buffer(), out.buffer(), spec)
                .err()
                .ok_or_else(|| Error::msg("a matmul wrote past its output"))?
        }
        "tile" => {
            // One row more than 65,535 workgroups of 16 rows cover; the
            // kernel would have been streamed, so only the host can refuse.
            let m = 65_535 * 16 + 1;
            let (a, b, out) = (
                Tensor::zeros(m, 1)?,
                Tensor::zeros(1, 1)?,
                Tensor::zeros(m, 1)?,
            );
            let spec = raw::MatmulSpec {
                m,
                n: 1,
                k: 1,
                transpose_a: false,
                transpose_b: false,
                alpha: 1.0,
                beta: 0.0,
            };
            raw::matmul(a.buffer(), b.buffer(), out.buffer(), spec)
                .err()
                .ok_or_else(|| Error::msg("a matmul past the GPU's tiles ran"))?
        }
        "bad_wgsl" => compute::Pipeline::new(BAD_WGSL, "main")
            .err()
            .ok_or_else(|| Error::msg("WGSL with a type error compiled"))?,
        "dispatch" => {
            let pipeline = compute::Pipeline::new(SCALE_WGSL, "main")?;
            let (x, out) = (Tensor::zeros(1, 4)?, Tensor::zeros(1, 4)?);
            pipeline
                .dispatch(&[&x, &out], [1 << 24, 1, 1])
                .err()
                .ok_or_else(|| Error::msg("a dispatch of 2^24 workgroups ran"))?
        }
        "binding" => {
            let pipeline = compute::Pipeline::new(SCALE_WGSL, "main")?;
            let x = Tensor::zeros(1, 4)?;
            pipeline
                .dispatch(&[&x], [1, 1, 1])
                .err()
                .ok_or_else(|| Error::msg("a dispatch missing a binding ran"))?
        }
        "bindings" => {
            let pipeline = compute::Pipeline::new(SCALE_WGSL, "main")?;
            let x = Tensor::zeros(1, 4)?;
            pipeline
                .dispatch(&[&x; 33], [1, 1, 1])
                .err()
                .ok_or_else(|| Error::msg("a dispatch of 33 bindings ran"))?
        }
        "refused_writes" => {
            // 4 MiB written 256 times to a buffer that does not exist: the
            // host copies it out of the guest before each refusal.
            let data = vec![0u8; 4 << 20];
            let mut refused = None;
            for _ in 0..256 {
                refused = raw::write(u32::MAX, 0, &data).err();
            }
            refused.ok_or_else(|| Error::msg("a write to no buffer was accepted"))?
        }
        "big_read" => {
            let t = Tensor::zeros(4096, 4096)?;
            raw::read(t.buffer(), 0, 64 << 20)
                .err()
                .ok_or_else(|| Error::msg("a 64 MiB read was answered"))?
        }
        "entry" => compute::Pipeline::new(SCALE_WGSL, &"m".repeat(300))
            .err()
            .ok_or_else(|| Error::msg("a 300-byte entry point was accepted"))?,
        "override" => compute::Pipeline::new(OVERRIDE_WGSL, "main")
            .err()
            .ok_or_else(|| Error::msg("an override-sized workgroup compiled"))?,
        "runaway" => {
            let pipeline = compute::Pipeline::new(RUNAWAY_WGSL, "main")?;
            let out = Tensor::zeros(1, 256)?;
            // Software Vulkan caps loops at 65,535 iterations per
            // invocation, so the length comes from the dispatch's size.
            pipeline.dispatch(&[&out], [65535, 65535, 1])?;
            return Err(Error::msg("a runaway shader finished"));
        }
        other => return Err(Error::msg(format!("unknown misuse {other:?}"))),
    };
    Err(Error::from(refused).context(format!("misuse {kind}")))
}

fn max_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            if g.is_nan() && w.is_nan() {
                0.0
            } else {
                (g - w).abs()
            }
        })
        .fold(0.0, f32::max)
}

/// Every kernel against a plain reference: `(name, largest difference)`.
fn check() -> Result<Vec<(String, f32)>> {
    let mut errors = Vec::new();
    // A small product, and one past 128 x 128, which a GPU computes in big
    // tiles (neither a multiple of its tile nor of its depth).
    let shapes = [
        ("matmul", 13u32, 7u32, 29u32),
        ("matmul_tiled", 130, 150, 29),
    ];
    let transposes = [(false, false), (true, false), (false, true), (true, true)];
    for ((name, m, n, k), (ta, tb)) in shapes
        .into_iter()
        .flat_map(|shape| transposes.map(|t| (shape, t)))
    {
        let av = values((m * k) as usize, 11);
        let bv = values((k * n) as usize, 12);
        let cv = values((m * n) as usize, 13);
        let a = if ta {
            Tensor::from_rows(k, m, &av)?
        } else {
            Tensor::from_rows(m, k, &av)?
        };
        let b = if tb {
            Tensor::from_rows(n, k, &bv)?
        } else {
            Tensor::from_rows(k, n, &bv)?
        };
        let mut out = Tensor::from_rows(m, n, &cv)?;
        gemm(&mut out, &a, ta, &b, tb, 0.5, 2.0)?;
        let (mu, nu, ku) = (m as usize, n as usize, k as usize);
        let mut want = vec![0.0f32; mu * nu];
        for i in 0..mu {
            for j in 0..nu {
                let mut dot = 0.0f64;
                for p in 0..ku {
                    let x = if ta { av[p * mu + i] } else { av[i * ku + p] };
                    let y = if tb { bv[j * ku + p] } else { bv[p * nu + j] };
                    dot += x as f64 * y as f64;
                }
                want[i * nu + j] = 0.5 * dot as f32 + 2.0 * cv[i * nu + j];
            }
        }
        errors.push((
            format!("{name}_{}{}", ta as u8, tb as u8),
            max_diff(&out.to_vec()?, &want),
        ));
    }

    let xv: Vec<f32> = values(64, 21).iter().map(|v| v * 3.0).collect();
    let pos: Vec<f32> = xv.iter().map(|v| v.abs() + 0.1).collect();
    let yv = values(64, 22);
    let x = Tensor::from_rows(8, 8, &xv)?;
    let p = Tensor::from_rows(8, 8, &pos)?;
    let y = Tensor::from_rows(8, 8, &yv)?;
    type UnaryCase = (Unary, fn(f32) -> f32, bool);
    let unary: [UnaryCase; 10] = [
        (Unary::Relu, |v| v.max(0.0), false),
        (Unary::Sigmoid, |v| 1.0 / (1.0 + (-v).exp()), false),
        (Unary::Tanh, f32::tanh, false),
        (Unary::Exp, f32::exp, false),
        (Unary::Log, f32::ln, true),
        (Unary::Neg, |v| -v, false),
        (Unary::Abs, f32::abs, false),
        (Unary::Sqrt, f32::sqrt, true),
        (Unary::Square, |v| v * v, false),
        (Unary::Recip, |v| 1.0 / v, true),
    ];
    for (op, f, positive) in unary {
        let (input, data) = if positive { (&p, &pos) } else { (&x, &xv) };
        let want: Vec<f32> = data.iter().map(|&v| f(v)).collect();
        errors.push((
            format!("{op:?}").to_lowercase(),
            max_diff(&input.map(op)?.to_vec()?, &want),
        ));
    }
    type BinaryCase = (Binary, fn(f32, f32) -> f32);
    let binary: [BinaryCase; 7] = [
        (Binary::Add, |a, b| a + b),
        (Binary::Sub, |a, b| a - b),
        (Binary::Mul, |a, b| a * b),
        (Binary::Div, |a, b| a / b),
        (Binary::Max, f32::max),
        (Binary::Min, f32::min),
        (Binary::ReluBackward, |a, b| if b > 0.0 { a } else { 0.0 }),
    ];
    for (op, f) in binary {
        let want: Vec<f32> = yv.iter().zip(&pos).map(|(&a, &b)| f(a, b)).collect();
        let mut name = format!("{op:?}").to_lowercase();
        let got = y.zip(op, &p)?.to_vec()?;
        errors.push((name.clone(), max_diff(&got, &want)));
        // The same with the output in place of the first input.
        let mut inplace = y.try_clone()?;
        inplace.zip_in_place(op, &p)?;
        name.push_str("_in_place");
        errors.push((name, max_diff(&inplace.to_vec()?, &want)));
    }

    let row = values(8, 23);
    let mut rows = x.try_clone()?;
    rows.add_row(&Tensor::from_rows(1, 8, &row)?)?;
    let want: Vec<f32> = xv.iter().enumerate().map(|(i, v)| v + row[i % 8]).collect();
    errors.push(("add_row".into(), max_diff(&rows.to_vec()?, &want)));

    let mut stepped = x.try_clone()?;
    stepped.axpy(-0.25, &y)?;
    let want: Vec<f32> = xv.iter().zip(&yv).map(|(a, b)| a - 0.25 * b).collect();
    errors.push(("axpy".into(), max_diff(&stepped.to_vec()?, &want)));

    let mut shifted = x.try_clone()?;
    shifted.affine_in_place(-2.0, 0.5)?;
    let want: Vec<f32> = xv.iter().map(|v| v * -2.0 + 0.5).collect();
    errors.push(("affine".into(), max_diff(&shifted.to_vec()?, &want)));

    // 4 x 16 reductions both ways.
    let wide = Tensor::from_rows(4, 16, &xv)?;
    for (op, name) in [
        (Reduce::Sum, "sum"),
        (Reduce::Mean, "mean"),
        (Reduce::Max, "max"),
        (Reduce::Min, "min"),
    ] {
        let fold = |items: &mut dyn Iterator<Item = f32>| -> f32 {
            let items: Vec<f32> = items.collect();
            match op {
                Reduce::Sum => items.iter().sum(),
                Reduce::Mean => items.iter().sum::<f32>() / items.len() as f32,
                Reduce::Max => items.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                Reduce::Min => items.iter().copied().fold(f32::INFINITY, f32::min),
            }
        };
        let want_rows: Vec<f32> = (0..4)
            .map(|r| fold(&mut (0..16).map(|c| xv[r * 16 + c])))
            .collect();
        let want_cols: Vec<f32> = (0..16)
            .map(|c| fold(&mut (0..4).map(|r| xv[r * 16 + c])))
            .collect();
        errors.push((
            format!("reduce_{name}_rows"),
            max_diff(&wide.reduce(op, Axis::Rows)?.to_vec()?, &want_rows),
        ));
        errors.push((
            format!("reduce_{name}_cols"),
            max_diff(&wide.reduce(op, Axis::Cols)?.to_vec()?, &want_cols),
        ));
    }

    let mut soft = wide.try_clone()?;
    soft.affine_in_place(100.0, 0.0)?; // large logits: the stable form is needed
    soft.softmax_rows()?;
    let mut want = Vec::new();
    for r in 0..4 {
        let line: Vec<f32> = (0..16).map(|c| xv[r * 16 + c] * 100.0).collect();
        let max = line.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = line.iter().map(|v| (v - max).exp()).collect();
        let total: f32 = exps.iter().sum();
        want.extend(exps.iter().map(|e| e / total));
    }
    errors.push(("softmax".into(), max_diff(&soft.to_vec()?, &want)));

    // Non-finite scalars reach the kernel as they are.
    let mut poisoned = x.try_clone()?;
    poisoned.affine_in_place(f32::NAN, f32::INFINITY)?;
    errors.push((
        "nan_scalar".into(),
        max_diff(&poisoned.to_vec()?, &[f32::NAN; 64]),
    ));

    if compute::info().shaders {
        let pipeline = compute::Pipeline::new(SCALE_WGSL, "main")?;
        let data = values(1000, 31);
        let input = Tensor::from_rows(1, 1000, &data)?;
        let out = Tensor::zeros(1, 1000)?;
        pipeline.dispatch(&[&input, &out], [1000u32.div_ceil(64), 1, 1])?;
        let want: Vec<f32> = data.iter().map(|v| v * 2.0 + 1.0).collect();
        errors.push(("shader".into(), max_diff(&out.to_vec()?, &want)));
    }
    Ok(errors)
}

/// `out = 2 x + 1`, 64 invocations per workgroup.
const SCALE_WGSL: &str = "\
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&out)) {
        out[id.x] = x[id.x] * 2.0 + 1.0;
    }
}
";

/// A workgroup size only known once the pipeline is made.
const OVERRIDE_WGSL: &str = "\
override size: u32 = 1024;
@compute @workgroup_size(size)
fn main() {}
";

/// A type error on line 4: an `f32` stored into a `u32`.
const BAD_WGSL: &str = "\
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1)
fn main() {
    out[0] = 1.5;
}
";

/// 60,000 dependent iterations per invocation: about 10^15 in all at the
/// dispatch `runaway` makes.
const RUNAWAY_WGSL: &str = "\
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) i: u32) {
    var v = f32(i);
    for (var n = 0u; n < 60000u; n++) {
        v = sin(v) * 1.0001 + 0.5;
    }
    out[i] = v;
}
";

wtune_guest::export!(Kernels);

// The built-in kernels of the GPU backend: the same semantics as the CPU
// kernels in ../cpu.rs. Every entry point shares one bind group layout:
// uniform parameters, two read-only inputs and the read-write output. An
// input that is the output itself is not bound twice (WebGPU forbids a
// buffer as both read-only and writable storage in one dispatch); a flag
// tells the kernel to read it from `out` instead.
//
// Element-wise kernels run 256 invocations per workgroup over a 2-D grid of
// workgroups (one dimension holds at most 65,535), so the element index is
// x + y * (workgroups along x) * 256.

struct Params {
    n: u32,      // elements, or outputs of a reduction, or softmax rows
    op: u32,     // which unary, binary or reduction
    flags: u32,  // A_IS_OUT | B_IS_OUT | TRANSPOSE_A | TRANSPOSE_B
    cols: u32,   // row length (binary_rows, softmax)
    m: u32,      // matmul: op(a) is m x k, op(b) is k x nn
    nn: u32,
    k: u32,
    len: u32,    // reduction: values per output
    outer: u32,  // reduction: value j of output o is at o * outer + j * inner
    inner: u32,
    s0: f32,     // scale, alpha
    s1: f32,     // shift, beta
}

const A_IS_OUT: u32 = 1u;
const B_IS_OUT: u32 = 2u;
const TRANSPOSE_A: u32 = 4u;
const TRANSPOSE_B: u32 = 8u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn load_a(i: u32) -> f32 {
    if ((p.flags & A_IS_OUT) != 0u) {
        return out[i];
    }
    return a[i];
}

fn load_b(i: u32) -> f32 {
    if ((p.flags & B_IS_OUT) != 0u) {
        return out[i];
    }
    return b[i];
}

fn element(g: vec3<u32>, groups: vec3<u32>) -> u32 {
    return g.x + g.y * groups.x * 256u;
}

fn unary_op(op: u32, x: f32) -> f32 {
    switch op {
        case 0u: { return max(x, 0.0); }
        case 1u: { return 1.0 / (1.0 + exp(-x)); }
        case 2u: { return tanh(x); }
        case 3u: { return exp(x); }
        case 4u: { return log(x); }
        case 5u: { return -x; }
        case 6u: { return abs(x); }
        case 7u: { return sqrt(x); }
        case 8u: { return x * x; }
        default: { return 1.0 / x; }
    }
}

fn binary_op(op: u32, x: f32, y: f32) -> f32 {
    switch op {
        case 0u: { return x + y; }
        case 1u: { return x - y; }
        case 2u: { return x * y; }
        case 3u: { return x / y; }
        case 4u: { return max(x, y); }
        case 5u: { return min(x, y); }
        default: { return select(0.0, x, y > 0.0); }
    }
}

@compute @workgroup_size(256)
fn unary(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(g, groups);
    if (i < p.n) {
        out[i] = unary_op(p.op, load_a(i));
    }
}

@compute @workgroup_size(256)
fn binary(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(g, groups);
    if (i < p.n) {
        out[i] = binary_op(p.op, load_a(i), load_b(i));
    }
}

@compute @workgroup_size(256)
fn binary_rows(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(g, groups);
    if (i < p.n) {
        out[i] = binary_op(p.op, load_a(i), b[i % p.cols]);
    }
}

@compute @workgroup_size(256)
fn affine(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(g, groups);
    if (i < p.n) {
        out[i] = load_a(i) * p.s0 + p.s1;
    }
}

@compute @workgroup_size(256)
fn axpy(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(g, groups);
    if (i < p.n) {
        out[i] = out[i] + p.s0 * load_a(i);
    }
}

// ----- matmul: 16 x 16 output tiles through workgroup memory -------------

var<workgroup> tile_a: array<array<f32, 16>, 16>;
var<workgroup> tile_b: array<array<f32, 16>, 16>;

// op(a)[r, c]: a is stored m x k, or k x m when transposed.
fn a_at(r: u32, c: u32) -> f32 {
    if (r >= p.m || c >= p.k) {
        return 0.0;
    }
    if ((p.flags & TRANSPOSE_A) != 0u) {
        return a[c * p.m + r];
    }
    return a[r * p.k + c];
}

// op(b)[r, c]: b is stored k x nn, or nn x k when transposed.
fn b_at(r: u32, c: u32) -> f32 {
    if (r >= p.k || c >= p.nn) {
        return 0.0;
    }
    if ((p.flags & TRANSPOSE_B) != 0u) {
        return b[c * p.k + r];
    }
    return b[r * p.nn + c];
}

@compute @workgroup_size(16, 16)
fn matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let row = wg.y * 16u + l.y;
    let col = wg.x * 16u + l.x;
    var acc = 0.0;
    let tiles = (p.k + 15u) / 16u;
    for (var t = 0u; t < tiles; t++) {
        tile_a[l.y][l.x] = a_at(row, t * 16u + l.x);
        tile_b[l.y][l.x] = b_at(t * 16u + l.y, col);
        workgroupBarrier();
        for (var q = 0u; q < 16u; q++) {
            acc += tile_a[l.y][q] * tile_b[q][l.x];
        }
        workgroupBarrier();
    }
    if (row < p.m && col < p.nn) {
        let i = row * p.nn + col;
        // As in BLAS, beta = 0 means `out` is not read (it may hold NaN).
        var v = p.s0 * acc;
        if (p.s1 != 0.0) {
            v += p.s1 * out[i];
        }
        out[i] = v;
    }
}

// ----- reductions and softmax: one workgroup per output or row -----------

var<workgroup> part: array<f32, 256>;

fn identity(op: u32) -> f32 {
    switch op {
        case 2u: { return bitcast<f32>(0xff800000u); } // max: -inf
        case 3u: { return bitcast<f32>(0x7f800000u); } // min: +inf
        default: { return 0.0; }                       // sum, mean
    }
}

fn combine(op: u32, x: f32, y: f32) -> f32 {
    switch op {
        case 2u: { return max(x, y); }
        case 3u: { return min(x, y); }
        default: { return x + y; }
    }
}

// Folds `part` into part[0]; every invocation of the workgroup calls it.
fn fold_part(op: u32, li: u32) {
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (li < s) {
            part[li] = combine(op, part[li], part[li + s]);
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(256)
fn reduce(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let o = wg.x + wg.y * groups.x;
    if (o >= p.n) {
        return;
    }
    var acc = identity(p.op);
    for (var j = li; j < p.len; j += 256u) {
        acc = combine(p.op, acc, a[o * p.outer + j * p.inner]);
    }
    part[li] = acc;
    fold_part(p.op, li);
    if (li == 0u) {
        var r = part[0];
        if (p.op == 1u) {
            r = r * (1.0 / f32(p.len));
        }
        out[o] = r;
    }
}

@compute @workgroup_size(256)
fn softmax(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
           @builtin(local_invocation_index) li: u32) {
    let r = wg.x + wg.y * groups.x;
    if (r >= p.n) {
        return;
    }
    let base = r * p.cols;
    var top = identity(2u);
    for (var j = li; j < p.cols; j += 256u) {
        top = max(top, load_a(base + j));
    }
    part[li] = top;
    fold_part(2u, li);
    let row_max = part[0];
    workgroupBarrier();
    var sum = 0.0;
    for (var j = li; j < p.cols; j += 256u) {
        sum += exp(load_a(base + j) - row_max);
    }
    part[li] = sum;
    fold_part(0u, li);
    let inv = 1.0 / part[0];
    for (var j = li; j < p.cols; j += 256u) {
        out[base + j] = exp(load_a(base + j) - row_max) * inv;
    }
}

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

// ----- matmul_tiled: 128 x 128 output tiles, 8 x 8 of them per invocation --
//
// For outputs of at least 128 rows and columns (the worker picks; see
// bounds.rs). Each step stages a 128 x 16 slice of op(a) and a 16 x 128
// slice of op(b) in workgroup memory, k-major, loaded so that neighbouring
// invocations read neighbouring addresses whichever operand is transposed.
// Each invocation keeps an 8 x 8 block of sums in sixteen vec4 registers
// (named, not an array: an array indexed in a loop can land in slow
// memory), its rows and columns 16 apart so that a subgroup's reads of the
// slices fall in distinct banks. Sums run over k in order, as in `matmul`.

const BIG: u32 = 128u;
const DEPTH: u32 = 16u;

var<workgroup> slice_a: array<array<f32, 128>, 16>;
var<workgroup> slice_b: array<array<f32, 128>, 16>;

// Row `row` of the output at columns col, col + 16, ..., col + 112.
fn store_eight(row: u32, col: u32, lo: vec4<f32>, hi: vec4<f32>) {
    if (row >= p.m) {
        return;
    }
    let sums = array<f32, 8>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
    for (var j = 0u; j < 8u; j++) {
        let c = col + 16u * j;
        if (c < p.nn) {
            let o = row * p.nn + c;
            // As in BLAS, beta = 0 means `out` is not read (it may hold NaN).
            var v = p.s0 * sums[j];
            if (p.s1 != 0.0) {
                v += p.s1 * out[o];
            }
            out[o] = v;
        }
    }
}

@compute @workgroup_size(16, 16)
fn matmul_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>,
                @builtin(local_invocation_index) li: u32) {
    let row0 = wg.y * BIG;
    let col0 = wg.x * BIG;
    let ta = (p.flags & TRANSPOSE_A) != 0u;
    let tb = (p.flags & TRANSPOSE_B) != 0u;
    var c00 = vec4<f32>();
    var c01 = vec4<f32>();
    var c10 = vec4<f32>();
    var c11 = vec4<f32>();
    var c20 = vec4<f32>();
    var c21 = vec4<f32>();
    var c30 = vec4<f32>();
    var c31 = vec4<f32>();
    var c40 = vec4<f32>();
    var c41 = vec4<f32>();
    var c50 = vec4<f32>();
    var c51 = vec4<f32>();
    var c60 = vec4<f32>();
    var c61 = vec4<f32>();
    var c70 = vec4<f32>();
    var c71 = vec4<f32>();
    let steps = (p.k + DEPTH - 1u) / DEPTH;
    for (var t = 0u; t < steps; t++) {
        let k0 = t * DEPTH;
        for (var s = 0u; s < 8u; s++) {
            let e = li + s * 256u;
            // op(a)[r, q]: along k where a is m x k, along m where k x m.
            var r = e / DEPTH;
            var q = e % DEPTH;
            if (ta) {
                r = e % BIG;
                q = e / BIG;
            }
            slice_a[q][r] = a_at(row0 + r, k0 + q);
            // op(b)[q, c]: along n where b is k x n, along k where n x k.
            var c = e % BIG;
            var qb = e / BIG;
            if (tb) {
                c = e / DEPTH;
                qb = e % DEPTH;
            }
            slice_b[qb][c] = b_at(k0 + qb, col0 + c);
        }
        workgroupBarrier();
        for (var q = 0u; q < DEPTH; q++) {
            let a0 = vec4<f32>(slice_a[q][l.y + 0u], slice_a[q][l.y + 16u], slice_a[q][l.y + 32u], slice_a[q][l.y + 48u]);
            let a1 = vec4<f32>(slice_a[q][l.y + 64u], slice_a[q][l.y + 80u], slice_a[q][l.y + 96u], slice_a[q][l.y + 112u]);
            let b0 = vec4<f32>(slice_b[q][l.x + 0u], slice_b[q][l.x + 16u], slice_b[q][l.x + 32u], slice_b[q][l.x + 48u]);
            let b1 = vec4<f32>(slice_b[q][l.x + 64u], slice_b[q][l.x + 80u], slice_b[q][l.x + 96u], slice_b[q][l.x + 112u]);
            c00 = fma(vec4<f32>(a0.x), b0, c00);
            c01 = fma(vec4<f32>(a0.x), b1, c01);
            c10 = fma(vec4<f32>(a0.y), b0, c10);
            c11 = fma(vec4<f32>(a0.y), b1, c11);
            c20 = fma(vec4<f32>(a0.z), b0, c20);
            c21 = fma(vec4<f32>(a0.z), b1, c21);
            c30 = fma(vec4<f32>(a0.w), b0, c30);
            c31 = fma(vec4<f32>(a0.w), b1, c31);
            c40 = fma(vec4<f32>(a1.x), b0, c40);
            c41 = fma(vec4<f32>(a1.x), b1, c41);
            c50 = fma(vec4<f32>(a1.y), b0, c50);
            c51 = fma(vec4<f32>(a1.y), b1, c51);
            c60 = fma(vec4<f32>(a1.z), b0, c60);
            c61 = fma(vec4<f32>(a1.z), b1, c61);
            c70 = fma(vec4<f32>(a1.w), b0, c70);
            c71 = fma(vec4<f32>(a1.w), b1, c71);
        }
        workgroupBarrier();
    }
    store_eight(row0 + l.y + 0u, col0 + l.x, c00, c01);
    store_eight(row0 + l.y + 16u, col0 + l.x, c10, c11);
    store_eight(row0 + l.y + 32u, col0 + l.x, c20, c21);
    store_eight(row0 + l.y + 48u, col0 + l.x, c30, c31);
    store_eight(row0 + l.y + 64u, col0 + l.x, c40, c41);
    store_eight(row0 + l.y + 80u, col0 + l.x, c50, c51);
    store_eight(row0 + l.y + 96u, col0 + l.x, c60, c61);
    store_eight(row0 + l.y + 112u, col0 + l.x, c70, c71);
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

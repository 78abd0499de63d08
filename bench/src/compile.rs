//! `compile`: what compiling untrusted components in `wtune compile-worker`
//! costs against compiling them in the host process, and a cache hit.

use std::path::Path;
use std::time::{Duration, Instant};

use wtune::sandbox::{CompileIsolation, CompileOptions, Sandbox, SandboxOptions};

use crate::report::Summary;

const RUNS: usize = 5;

/// Wall time of loading `bytes` in a sandbox built from `options`, in ms.
fn load_time(options: impl Fn() -> SandboxOptions, bytes: &[u8]) -> Summary {
    let times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let sandbox = Sandbox::new(options()).expect("engine");
            let start = Instant::now();
            sandbox.load_bytes(bytes).expect("the guest loads");
            start.elapsed()
        })
        .collect();
    Summary::ms(&times)
}

/// Prints the table for the guests under `root/target/wasm32-wasip2/release`.
pub fn run(root: &Path) {
    out!("\n### Loading a component: compile worker against in-process compile ({RUNS} runs)\n");
    out!(
        "| component | size | in process, no cache | compile worker, no cache | cache hit |\n| --- | --- | --- | --- | --- |"
    );
    let cache = tempfile::tempdir().expect("cache dir");
    for name in ["hostile", "digits_mlp"] {
        let path = root
            .join("target/wasm32-wasip2/release")
            .join(format!("{name}.wasm"));
        let bytes = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run `bash scripts/setup.sh`)", path.display()));
        let uncached = |isolation| {
            move || SandboxOptions {
                cache_dir: None,
                compile: CompileOptions {
                    isolation,
                    ..CompileOptions::default()
                },
                ..SandboxOptions::default()
            }
        };
        let in_process = load_time(uncached(CompileIsolation::InProcess), &bytes);
        let worker = load_time(uncached(CompileIsolation::Process), &bytes);
        let cached = || SandboxOptions {
            cache_dir: Some(cache.path().to_path_buf()),
            ..SandboxOptions::default()
        };
        Sandbox::new(cached()).unwrap().load_bytes(&bytes).unwrap();
        let hit = load_time(cached, &bytes);
        let cell = |summary: Summary| format!("{} ms", summary.cell(0));
        out!(
            "| {name} | {} KiB | {} | {} | {} |",
            bytes.len() >> 10,
            cell(in_process),
            cell(worker),
            cell(hit)
        );
    }
}

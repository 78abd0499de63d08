//! Compiling components a stranger wrote: in a separate process under time
//! and memory limits, only when an allowlist (if any) names them, and
//! through a cache whose entries are checked before their machine code is
//! loaded.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use wtune::sandbox::{CompileIsolation, CompileOptions, ContractError, Sandbox, SandboxOptions};

/// A component whose core module has `functions` small functions: quick
/// to parse, slow to compile (20 000 take about 40 CPU seconds, and the
/// worker compiles on at most 8 threads, so at least 5 s anywhere).
fn many_functions(functions: usize) -> Vec<u8> {
    let body = "local.get 0 i32.const 7 i32.mul local.set 0 ".repeat(50);
    let funcs: String = (0..functions)
        .map(|_| format!("(func (param i32) (result i32) {body} local.get 0)\n"))
        .collect();
    wat::parse_str(format!("(component (core module {funcs}))")).unwrap()
}

/// A component with one enormous function (5 MB of code, within
/// wasmparser's 7.6 MB per function), which Cranelift compiles with over
/// 600 MB of memory whatever the machine: it is one function, on one
/// thread.
fn one_huge_function() -> Vec<u8> {
    let body = "local.get 0 i32.const 7 i32.mul local.get 0 i32.add local.set 0 ".repeat(500_000);
    wat::parse_str(format!(
        "(component (core module (func (param i32) (result i32) {body} local.get 0)))"
    ))
    .unwrap()
}

fn sandbox(compile: CompileOptions, cache: Option<&Path>) -> Sandbox {
    sandbox_allowing(compile, cache, None)
}

fn sandbox_allowing(
    compile: CompileOptions,
    cache: Option<&Path>,
    allowed: Option<BTreeSet<String>>,
) -> Sandbox {
    Sandbox::new(SandboxOptions {
        cache_dir: cache.map(Path::to_path_buf),
        compile,
        allowed_components: allowed,
        ..SandboxOptions::default()
    })
    .expect("engine")
}

fn refusal(sandbox: &Sandbox, bytes: &[u8]) -> ContractError {
    match sandbox.load_bytes(bytes) {
        Ok(_) => panic!("should have been refused"),
        Err(e) => e,
    }
}

fn hostile_bytes() -> Vec<u8> {
    std::fs::read(common::guest("hostile")).unwrap()
}

#[test]
fn a_compile_bomb_is_stopped_at_the_time_limit_and_the_host_goes_on() {
    let sandbox = sandbox(
        CompileOptions {
            timeout: Duration::from_millis(300),
            ..CompileOptions::default()
        },
        None,
    );
    let err = refusal(&sandbox, &many_functions(20_000));
    assert!(matches!(err, ContractError::CompileLimit { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "component refused: compiling it took longer than the 300ms compile time limit \
         (limits.compile_timeout)"
    );
    // The host goes on: an honest component compiles (in a sandbox with
    // the default limit, as 300 ms is too short for it on a slow machine).
    let roomy = self::sandbox(CompileOptions::default(), None);
    let program = roomy
        .load_bytes(&hostile_bytes())
        .expect("benign component");
    assert!(program.snapshots().is_ok());
}

#[test]
fn a_compile_that_needs_more_memory_than_allowed_is_refused() {
    let sandbox = sandbox(
        CompileOptions {
            memory: 256 << 20,
            ..CompileOptions::default()
        },
        None,
    );
    let err = refusal(&sandbox, &one_huge_function());
    assert_eq!(
        err.to_string(),
        "component refused: compiling it needed more than the 256 MiB compile memory limit \
         (limits.compile_memory)"
    );
    // The limit bounds the compiler's address space, which the host's
    // honest guests fit in.
    sandbox
        .load_bytes(&hostile_bytes())
        .expect("the benign component fits");
}

#[test]
fn invalid_wasm_is_reported_from_the_compile_worker() {
    let sandbox = sandbox(CompileOptions::default(), None);
    // Valid structure, but the function's body leaves the wrong type on
    // the stack, which only validation during compilation notices.
    let bytes = wat::parse_str("(component (core module (func (result i32) i64.const 1)))");
    let bytes = match bytes {
        Ok(bytes) => bytes,
        Err(e) => panic!("{e}"),
    };
    let err = refusal(&sandbox, &bytes);
    assert!(matches!(err, ContractError::Invalid { .. }), "{err:?}");
    assert!(err.to_string().contains("type mismatch"), "{err}");
}

#[test]
fn in_process_compilation_loads_the_same_program() {
    let isolated = sandbox(CompileOptions::default(), None);
    let in_process = sandbox(
        CompileOptions {
            isolation: CompileIsolation::InProcess,
            ..CompileOptions::default()
        },
        None,
    );
    let bytes = hostile_bytes();
    let a = isolated.load_bytes(&bytes).unwrap();
    let b = in_process.load_bytes(&bytes).unwrap();
    assert_eq!(a.digest(), b.digest());
    assert!(a.snapshots().is_ok() && b.snapshots().is_ok());
}

#[test]
fn only_allowlisted_components_load_and_others_are_never_compiled() {
    let bytes = hostile_bytes();
    let digest = blake3::hash(&bytes).to_hex().to_string();
    let cache = tempfile::tempdir().unwrap();

    let pinned = sandbox_allowing(
        CompileOptions::default(),
        Some(cache.path()),
        Some(BTreeSet::from(["0".repeat(64), "1".repeat(64)])),
    );
    let err = refusal(&pinned, &bytes);
    assert_eq!(
        err.to_string(),
        format!(
            "component blake3 {digest} is not on the allowlist (2 allowed components); it was \
             refused before compiling"
        )
    );
    // A refused component leaves nothing in the compile cache: it was
    // never compiled.
    let entries = std::fs::read_dir(cache.path()).map_or(0, |dir| dir.count());
    assert_eq!(entries, 0);

    // `describe` (what `wtune inspect` uses) compiles too, so it obeys the
    // allowlist as well.
    let err = match pinned.describe(&bytes) {
        Ok(_) => panic!("describe should refuse it"),
        Err(e) => e,
    };
    assert!(matches!(err, ContractError::NotAllowed { .. }), "{err:?}");

    let allowed = sandbox_allowing(
        CompileOptions::default(),
        Some(cache.path()),
        Some(BTreeSet::from([digest.clone()])),
    );
    let program = allowed.load_bytes(&bytes).expect("allowlisted component");
    assert_eq!(program.digest(), digest);
}

#[test]
fn a_damaged_cache_entry_is_recompiled_and_replaced() {
    let cache = tempfile::tempdir().unwrap();
    let bytes = hostile_bytes();
    sandbox(CompileOptions::default(), Some(cache.path()))
        .load_bytes(&bytes)
        .unwrap();
    let entries: Vec<_> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let entry = &entries[0];
    let sound = std::fs::read(entry).unwrap();

    // Flip one byte in the middle of the machine code.
    let mut damaged = sound.clone();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x5a;
    std::fs::write(entry, &damaged).unwrap();

    let program = sandbox(CompileOptions::default(), Some(cache.path()))
        .load_bytes(&bytes)
        .expect("recompiled");
    assert!(program.snapshots().is_ok());
    let replaced = std::fs::read(entry).unwrap();
    assert!(replaced != damaged, "the damaged entry was replaced");
    let (artifact, checksum) = replaced.split_at(replaced.len() - 32);
    assert!(
        blake3::hash(artifact).as_bytes() == checksum,
        "the new entry carries its checksum"
    );
    assert_eq!(replaced.len(), sound.len());
}

#[test]
fn a_missing_compile_worker_is_named_with_the_way_out() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::wtune()
        .env("WTUNE_WORKER", dir.path().join("no-such-wtune"))
        .arg("run")
        .arg(common::guest("hostile"))
        .arg("--no-cache")
        .arg("--output-dir")
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot compile the component: starting the compile worker")
            && stderr.contains("no-such-wtune"),
        "{stderr}"
    );
    assert!(!dir.path().join("out").exists(), "nothing ran");
}

#[test]
fn the_cli_refuses_components_off_the_allowlist_and_bad_digests() {
    let model = common::guest("hostile");
    let dir = tempfile::tempdir().unwrap();
    let cases: [(Vec<String>, &str); 2] = [
        (
            vec!["--allow-component".into(), "0".repeat(64)],
            "is not on the allowlist (1 allowed component); it was refused before compiling",
        ),
        (
            vec!["--allow-component".into(), "blake3:xyz".into()],
            "--allow-component: \"blake3:xyz\" is not a blake3 digest",
        ),
    ];
    for (i, (args, expected)) in cases.into_iter().enumerate() {
        let out = common::wtune()
            .arg("run")
            .arg(&model)
            .args(&args)
            .arg("--output-dir")
            .arg(dir.path().join(format!("run{i}")))
            .arg("--no-cache")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
    }

    let bad_files = [
        (
            "[security]\nallowed_components = []\n",
            "security.allowed_components is empty, so no component could run",
        ),
        (
            "[security]\ncompile = \"sandboxed\"\n",
            "security.compile: compile isolation must be \"process\" or \"in-process\"",
        ),
        (
            "[limits]\ncompile_memory = \"1MiB\"\n",
            "limits.compile_memory must be at least 256 MiB",
        ),
        (
            "[limits]\ncompile_timeout = \"none\"\n",
            "limits.compile_timeout must be a duration",
        ),
    ];
    for (i, (text, expected)) in bad_files.into_iter().enumerate() {
        let config = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&config, text).unwrap();
        let out = common::wtune()
            .arg("run")
            .arg(&model)
            .arg("--config")
            .arg(&config)
            .arg("--output-dir")
            .arg(dir.path().join(format!("bad{i}")))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(expected), "{text}: {stderr}");
        assert!(!dir.path().join(format!("bad{i}")).exists(), "nothing ran");
    }

    let digest = blake3::hash(&std::fs::read(&model).unwrap()).to_hex();
    let config = dir.path().join("experiment.toml");
    std::fs::write(
        &config,
        format!(
            "[security]\nallowed_components = [\"blake3:{}\"]\ncompile = \"process\"\n\
             [limits]\ncompile_timeout = \"1m\"\ncompile_memory = \"2GiB\"\n\
             [param_space]\nattack = \"none\"\niterations = 2\n",
            digest.to_string().to_uppercase()
        ),
    )
    .unwrap();
    let out = common::wtune()
        .arg("run")
        .arg(&model)
        .arg("--config")
        .arg(&config)
        .arg("--output-dir")
        .arg(dir.path().join("allowed"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

//! One [`Sandbox`] per process and set of engine settings, and one loaded
//! [`Program`] per component: a Ray worker that runs trial after trial
//! builds the engine (and starts GPU workers) once, and compiles a
//! component once (the disk cache of `wtune run` makes even that a load).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use wtune::config::Plan;
use wtune::sandbox::{Program, Sandbox, SandboxOptions};

/// Where a component comes from.
pub(crate) enum Source<'a> {
    Path(&'a Path),
    Bytes(&'a [u8]),
}

/// The engine settings a plan asks for, as the key of its sandbox.
fn engine_key(plan: &Plan) -> String {
    format!(
        "{}|{:?}|{:?}|{:?}",
        plan.max_wasm_stack, plan.compute, plan.compile, plan.allowed_components
    )
}

struct Loaded {
    sandbox: Arc<Sandbox>,
    programs: HashMap<String, Program>,
}

static SANDBOXES: Mutex<Vec<(String, Loaded)>> = Mutex::new(Vec::new());

/// The plan's sandbox (made on first use) and `source` loaded in it.
/// Errors are the sandbox's own words.
pub(crate) fn load(plan: &Plan, source: Source<'_>) -> Result<Program, Failure> {
    let key = engine_key(plan);
    let mut sandboxes = SANDBOXES.lock().unwrap_or_else(PoisonError::into_inner);
    let index = match sandboxes.iter().position(|(k, _)| *k == key) {
        Some(index) => index,
        None => {
            let sandbox = Sandbox::new(SandboxOptions {
                max_wasm_stack: plan.max_wasm_stack,
                compute: plan.compute,
                compile: plan.compile,
                allowed_components: plan.allowed_components.clone(),
                ..SandboxOptions::default()
            })
            .map_err(|e| Failure::Host(format!("cannot start the sandbox: {e:#}")))?;
            sandboxes.push((
                key,
                Loaded {
                    sandbox: Arc::new(sandbox),
                    programs: HashMap::new(),
                },
            ));
            sandboxes.len() - 1
        }
    };
    let loaded = &mut sandboxes[index].1;
    // The digest of the bytes names the program, so a file rewritten in
    // place is loaded again.
    let bytes;
    let bytes = match source {
        Source::Bytes(bytes) => bytes,
        Source::Path(path) => {
            bytes = std::fs::read(path)
                .map_err(|e| Failure::Component(format!("cannot read {}: {e}", path.display())))?;
            &bytes[..]
        }
    };
    let digest = blake3::hash(bytes).to_hex().to_string();
    if let Some(program) = loaded.programs.get(&digest) {
        return Ok(program.clone());
    }
    let program = loaded.sandbox.load_bytes(bytes).map_err(|e| match source {
        Source::Path(path) => Failure::Component(format!("{}: {e}", path.display())),
        Source::Bytes(_) => Failure::Component(e.to_string()),
    })?;
    loaded.programs.insert(digest, program.clone());
    Ok(program)
}

/// Why a component could not be made ready.
pub(crate) enum Failure {
    Component(String),
    Host(String),
}

//! `wtune run`: the plan, the sandbox and the backend, then [`super::execute`].

use crate::config::{self, Overrides};
use crate::sandbox::{SandboxOptions, human_bytes};
use crate::wasm_backend::WasmBackend;

use super::Failure;
use super::args::RunArgs;
use super::common::{claim, limits_line, sandbox, snapshot_key};
use super::execute::{Ready, execute};
use super::setup::Setup;

/// The entry point of `wtune run`: plans the experiment from the file and
/// flags, loads the component and runs it.
pub(super) fn run(args: RunArgs) -> Result<(), Failure> {
    let serve = args.serve.options()?;
    let overrides = Overrides {
        name: args.name,
        num_samples: args.num_samples,
        max_concurrent: args.max_concurrent,
        metric: args.metric,
        mode: args.mode,
        stop: args.stop,
        fuel: args.limits.fuel,
        fuel_per_call: args.limits.fuel_per_call,
        memory: args.limits.memory,
        timeout: args.limits.timeout,
        data: args.data,
        output_dir: args.output_dir,
        seed: args.seed,
        checkpoint: args.checkpoint,
        checkpoint_freq: args.checkpoint_freq,
        checkpoint_at_end: args.checkpoint_at_end,
        max_failures: args.max_failures,
        restore_from: args.restore_from,
        scheduler: args.scheduler,
        search: args.search,
        compute: args.compute,
        allowed_components: args.allow_component,
        no_tensorboard: args.no_tensorboard,
        mlflow: args.mlflow,
    };
    let plan =
        config::plan(&args.model, args.config.as_deref(), &overrides).map_err(Failure::user)?;
    plan.check_mutations().map_err(Failure::user)?;
    let sandbox = sandbox(
        args.cache,
        SandboxOptions {
            max_wasm_stack: plan.max_wasm_stack,
            compute: plan.compute,
            compile: plan.compile,
            allowed_components: plan.allowed_components.clone(),
            ..SandboxOptions::default()
        },
    )?;
    let program = sandbox.load(&args.model).map_err(Failure::user)?;
    // Refusals first: a refused run says only why.
    let key = snapshot_key(plan.snapshot_key_file.as_deref())?;
    for note in &plan.notes {
        eprintln!("note: {note}");
    }
    let mut backend =
        WasmBackend::new(program.clone(), plan.limits.clone(), plan.data.clone()).snapshot_key(key);
    match plan.checkpoint_mode {
        Some(mode) => backend = backend.checkpoint_mode(mode).map_err(Failure::user)?,
        None => {
            let checkpoints = &plan.spec.checkpoint;
            if let Err(refusal) = program.snapshots()
                && (checkpoints.freq > 0 || checkpoints.at_end)
            {
                eprintln!(
                    "note: host snapshots are not possible for this component ({}); \
                     checkpoints use its own save()/restore()",
                    refusal.reason()
                );
            }
        }
    }
    let mut fixed_config = None;
    if let Some(path) = &plan.spec.restore_from {
        let file = backend.open_checkpoint(path).map_err(Failure::user)?;
        if file.is_host_snapshot() {
            // A host snapshot holds its trial's configuration in memory.
            if !plan.empty_space {
                return Err(Failure::user(format!(
                    "restore_from: {} is a host snapshot, which continues with its own \
                     configuration; remove param_space, or start from a guest checkpoint \
                     (checkpoint = \"guest\") to try new configurations",
                    path.display()
                )));
            }
            fixed_config = Some(file.meta().config.clone());
        }
    }

    let limits = &plan.limits;
    let model = std::path::absolute(&args.model).unwrap_or_else(|_| args.model.clone());
    eprintln!("{}", limits_line(limits));
    if program.uses_compute() {
        let compute = sandbox.compute();
        eprintln!(
            "compute: {} on {}, {} per trial, {} in all",
            compute.kind,
            compute.name,
            human_bytes(plan.compute.trial_quota),
            human_bytes(plan.compute.total_quota),
        );
    }

    let mut spec = plan.spec;
    spec.configs = Vec::new();
    let mut setup = Setup {
        model,
        model_blake3: program.digest().to_string(),
        spec: spec.clone(),
        limits: plan.limits,
        max_wasm_stack: plan.max_wasm_stack,
        data: plan.data,
        checkpoint: backend.mode(),
        snapshot_key_file: plan
            .snapshot_key_file
            .map(|p| std::path::absolute(&p).unwrap_or(p)),
        scheduler: plan.scheduler,
        seed: plan.seed,
        num_samples: plan.num_samples,
        param_space: plan.param_space,
        search: plan.search,
        fixed_config,
        compute: plan.compute,
        compile: plan.compile,
        allowed_components: plan.allowed_components,
        tracking: plan.tracking,
    };
    let deciders = (setup.scheduler()?, setup.searcher()?);
    let mut ready = Ready::new(&backend, spec, &setup, serve)?;
    let claimed = claim(&setup.spec.output_dir, plan.output_dir_named)?;
    if claimed.dir != setup.spec.output_dir {
        // Another run took the name first: this one has the next.
        setup.spec.output_dir.clone_from(&claimed.dir);
        if let Err(refused) = ready.moved_to(&setup) {
            claimed.abandon();
            return Err(refused);
        }
    }
    execute(backend, ready, deciders, None, &setup, claimed.lock)
}

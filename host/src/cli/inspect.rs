//! `wtune serve DIR` and `wtune inspect`.

use std::path::Path;

use crate::report::terminal::inert;
use crate::sandbox::{SandboxOptions, human_bytes};
use crate::serve;

use super::Failure;
use super::args::{CacheArgs, ServeDirArgs};
use super::common::{print_out, sandbox};

/// `wtune serve DIR`: the dashboard and API for an experiment directory,
/// read-only, until Ctrl-C.
pub(super) fn serve_dir(args: ServeDirArgs) -> Result<(), Failure> {
    let options = serve::ServeOptions {
        addr: args.addr,
        token: args.token,
    };
    options.check().map_err(Failure::user)?;
    // Refuse a directory that is not an experiment now, not on the first
    // page load.
    serve::view::ExperimentDir::new(&args.dir)
        .state()
        .map_err(Failure::user)?;
    let runtime = tokio::runtime::Runtime::new()
        .map_err(|e| Failure::runtime(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(async {
        let server = serve::Server::start(args.dir.clone(), None, &options)
            .await
            .map_err(Failure::user)?;
        eprintln!(
            "serving the dashboard at {} for {} (read-only; Ctrl-C to stop)",
            server.url(),
            args.dir.display()
        );
        if let Some(line) = crate::report::tensorboard_line(&args.dir) {
            eprintln!("{}", crate::report::terminal::inert(&line));
        }
        tokio::signal::ctrl_c()
            .await
            .map_err(|e| Failure::runtime(format!("waiting for Ctrl-C: {e}")))
    })
}

/// The entry point of `wtune inspect`: a component's imports, exports and
/// how it fits the contract.
pub(super) fn inspect(model: &Path) -> Result<(), Failure> {
    let bytes = std::fs::read(model)
        .map_err(|e| Failure::user(format!("cannot read {}: {e}", model.display())))?;
    let sandbox = sandbox(
        CacheArgs {
            cache_dir: None,
            no_cache: false,
        },
        SandboxOptions::default(),
    )?;
    let description = sandbox
        .describe(&bytes)
        .map_err(|e| Failure::user(format!("{}: {e}", model.display())))?;
    use std::fmt::Write as _;
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = writeln!(text, "component: {}", model.display());
    let _ = writeln!(text, "size: {}", human_bytes(bytes.len() as u64));
    let _ = writeln!(text, "blake3: {}", blake3::hash(&bytes).to_hex());
    // Names and types are the component's own text (an import's name may
    // hold any character but `<` and `>`): shown inert, like all guest text.
    let item = |name: &str, ty: &str| format!("  {}: {}", inert(name), inert(ty));
    let _ = writeln!(text, "imports:");
    for (name, ty) in &description.imports {
        let _ = writeln!(text, "{}", item(name, ty));
    }
    let _ = writeln!(text, "exports:");
    for (name, ty) in &description.exports {
        let _ = writeln!(text, "{}", item(name, ty));
    }
    let fits = description.fits.map(|()| {
        let _ = writeln!(text, "contract: fits {}", crate::sandbox::WORLD);
        match crate::snapshot::instrument(&bytes) {
            Ok(_) => {
                let _ = writeln!(text, "host snapshots: supported");
            }
            Err(refusal) => {
                let _ = writeln!(text, "host snapshots: no ({})", refusal.reason());
            }
        }
    });
    print_out(&text);
    fits.map_err(|e| Failure::user(format!("{}: {e}", model.display())))
}

//! What each trial's sandbox is given: its limits, host compute, where
//! components are compiled, and which components may run at all.

use std::collections::BTreeSet;
use std::time::Duration;

use super::error::{ConfigError, bad};
use super::file::{ExperimentToml, LimitsToml};
use super::overrides::Overrides;
use crate::compute::ComputeOptions;
use crate::sandbox::{CompileIsolation, CompileOptions, Limits};
use crate::units::{self, human_bytes};

/// The sandbox's part of the plan.
pub(super) struct SandboxSettings {
    pub(super) limits: Limits,
    pub(super) max_wasm_stack: usize,
    pub(super) compute: ComputeOptions,
    pub(super) compile: CompileOptions,
    /// `max_concurrent_trials`, lowered where the process's file
    /// descriptors cannot hold that many trials (see [`descriptors_fit`]).
    pub(super) max_concurrent: usize,
    pub(super) allowed_components: Option<BTreeSet<String>>,
}

/// `[limits]` (with the `--fuel`, `--memory`, ... flags over it),
/// `compute`, `[security]` and the allowlist flags, each checked; notes
/// where a setting is ignored or lowers the concurrency.
pub(super) fn settings(
    file: &mut ExperimentToml,
    overrides: &Overrides,
    max_concurrent: usize,
    notes: &mut Vec<String>,
) -> Result<SandboxSettings, ConfigError> {
    let limits_file = file.limits.take().unwrap_or_default();
    let compute = compute(&overrides.compute, &file.compute, &limits_file)?;
    let compile = compile(
        file.security.as_ref().and_then(|s| s.compile.as_deref()),
        &limits_file,
    )?;
    if compile.isolation == CompileIsolation::InProcess
        && (limits_file.compile_timeout.is_some() || limits_file.compile_memory.is_some())
    {
        notes.push(
            "security.compile = \"in-process\" compiles without limits; \
             limits.compile_timeout and limits.compile_memory apply to the compile worker only"
                .into(),
        );
    }
    let (limits, max_wasm_stack) = limits(limits_file, overrides)?;
    let max_concurrent = descriptors_fit(
        &limits,
        max_concurrent,
        crate::sandbox::descriptor_limit(),
        notes,
    )?;
    let allowed_components = if overrides.allowed_components.is_empty() {
        match file
            .security
            .as_ref()
            .and_then(|s| s.allowed_components.as_ref())
        {
            Some(list) => Some(allowlist(list, "security.allowed_components")?),
            None => None,
        }
    } else {
        Some(allowlist(
            &overrides.allowed_components,
            "--allow-component",
        )?)
    };
    Ok(SandboxSettings {
        limits,
        max_wasm_stack,
        compute,
        compile,
        max_concurrent,
        allowed_components,
    })
}

/// `security.compile` and the `limits.compile_*` limits.
fn compile(isolation: Option<&str>, limits: &LimitsToml) -> Result<CompileOptions, ConfigError> {
    let mut options = CompileOptions::default();
    if let Some(isolation) = isolation {
        options.isolation = isolation
            .parse()
            .map_err(|e| bad(format!("security.compile: {e}")))?;
    }
    if let Some(v) = &limits.compile_timeout {
        options.timeout = match duration(v, "limits.compile_timeout") {
            Ok(Some(timeout)) => timeout,
            _ => {
                return Err(bad(format!(
                    "limits.compile_timeout must be a duration such as \"2m\" or a number of \
                     seconds, at most 100 years; got {v}"
                )));
            }
        };
    }
    if let Some(v) = &limits.compile_memory {
        options.memory = size(v, "limits.compile_memory")?;
        if options.memory < MIN_COMPILE_MEMORY {
            return Err(bad(format!(
                "limits.compile_memory must be at least {}: the compile worker's own code, \
                 threads and engine take about half of that",
                human_bytes(MIN_COMPILE_MEMORY)
            )));
        }
    }
    Ok(options)
}

/// Below this the compile worker cannot even start its engine.
const MIN_COMPILE_MEMORY: u64 = 256 << 20;

/// Component digests as `wtune inspect` prints them: 64 hex digits, with or
/// without a `blake3:` prefix.
pub fn allowlist(entries: &[String], key: &str) -> Result<BTreeSet<String>, ConfigError> {
    if entries.is_empty() {
        return Err(bad(format!(
            "{key} is empty, so no component could run; list the blake3 digests `wtune \
             inspect` prints, or leave it out to allow any component"
        )));
    }
    entries
        .iter()
        .map(|entry| {
            let digest = entry.trim();
            // As `wtune inspect` prints it ("blake3: HEX") or bare.
            let digest = digest
                .strip_prefix("blake3:")
                .unwrap_or(digest)
                .trim_start();
            if digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                Ok(digest.to_ascii_lowercase())
            } else {
                Err(bad(format!(
                    "{key}: {entry:?} is not a blake3 digest (64 hex digits, as `wtune inspect` \
                     prints)"
                )))
            }
        })
        .collect()
}

/// `compute = "auto"` and the `limits.compute_memory*` quotas.
fn compute(
    flag: &Option<String>,
    key: &Option<String>,
    limits: &LimitsToml,
) -> Result<ComputeOptions, ConfigError> {
    let mut options = ComputeOptions::default();
    if let Some(mode) = flag {
        options.mode = mode.parse().map_err(|_| {
            bad(format!(
                "--compute {mode:?} is not a backend; use auto, cpu or gpu"
            ))
        })?;
    } else if let Some(mode) = key {
        options.mode = mode.parse().map_err(bad)?;
    }
    if let Some(v) = &limits.compute_memory {
        options.trial_quota = size(v, "limits.compute_memory")?;
    }
    if let Some(v) = &limits.compute_memory_total {
        options.total_quota = size(v, "limits.compute_memory_total")?;
    } else {
        options.total_quota = options.total_quota.max(options.trial_quota);
    }
    if options.trial_quota > options.total_quota {
        return Err(bad(format!(
            "limits.compute_memory ({}) is more than limits.compute_memory_total ({}): no \
             trial could use its quota",
            human_bytes(options.trial_quota),
            human_bytes(options.total_quota)
        )));
    }
    Ok(options)
}

fn limits(file: LimitsToml, overrides: &Overrides) -> Result<(Limits, usize), ConfigError> {
    let mut limits = Limits::default();
    if let Some(v) = file.fuel_per_call {
        limits.fuel_per_call = fuel(&v, "limits.fuel_per_call")?;
    }
    if let Some(v) = file.fuel_per_trial {
        limits.fuel_per_trial = fuel(&v, "limits.fuel_per_trial")?;
    }
    if let Some(v) = file.memory {
        limits.memory_bytes = size(&v, "limits.memory")?;
    }
    if let Some(v) = file.call_timeout {
        limits.call_timeout = duration(&v, "limits.call_timeout")?;
    }
    limit_flags(&mut limits, overrides)?;
    if let Some(v) = file.log_size {
        limits.log_bytes = size(&v, "limits.log_size")?;
    }
    if let Some(v) = file.checkpoint_size {
        limits.checkpoint_bytes = size(&v, "limits.checkpoint_size")?;
    }
    if let Some(v) = file.result_size {
        limits.result_bytes = size(&v, "limits.result_size")?;
    }
    if let Some(v) = file.disk {
        limits.disk_bytes = size(&v, "limits.disk")?;
    }
    if let Some(n) = file.disk_files {
        limits.disk_files = n;
    }
    if let Some(n) = file.table_elements {
        limits.table_elements = n;
    }
    if let Some(n) = file.open_files {
        if n < MIN_OPEN_FILES {
            return Err(bad(format!(
                "limits.open_files must be at least {MIN_OPEN_FILES} (a trainable needs a few \
                 handles for its directories and output streams); got {n}"
            )));
        }
        limits.open_files = n;
    }
    let stack = match file.stack {
        Some(v) => size(&v, "limits.stack")?,
        None => 1 << 20,
    };
    if !(64 << 10..=256 << 20).contains(&stack) {
        return Err(bad("limits.stack must be between 64KiB and 256MiB"));
    }
    Ok((limits, stack as usize))
}

/// `--fuel`, `--fuel-per-call`, `--memory` and `--timeout` over `limits`:
/// the limits a flag may set, for `wtune run` and `wtune resume` alike.
fn limit_flags(limits: &mut Limits, overrides: &Overrides) -> Result<(), ConfigError> {
    let flag = |s: &Option<String>| s.as_ref().map(|s| toml::Value::String(s.clone()));
    if let Some(v) = flag(&overrides.fuel_per_call) {
        limits.fuel_per_call = fuel(&v, "--fuel-per-call")?;
    }
    if let Some(v) = flag(&overrides.fuel) {
        limits.fuel_per_trial = fuel(&v, "--fuel")?;
    }
    if let Some(v) = flag(&overrides.memory) {
        limits.memory_bytes = size(&v, "--memory")?;
    }
    if let Some(v) = flag(&overrides.timeout) {
        limits.call_timeout = duration(&v, "--timeout")?;
    }
    Ok(())
}

/// What `wtune resume` may change of a saved run's sandbox: the limits
/// flags over `limits`, and `max_concurrent` (default: the saved one)
/// fitted to the process's descriptors as [`settings`] fits it. Returns
/// the concurrency to run with.
pub fn resumed_limits(
    limits: &mut Limits,
    overrides: &Overrides,
    max_concurrent: usize,
    notes: &mut Vec<String>,
) -> Result<usize, ConfigError> {
    limit_flags(limits, overrides)?;
    let max_concurrent = overrides.max_concurrent.unwrap_or(max_concurrent);
    if max_concurrent == 0 {
        return Err(bad("--max-concurrent must be at least 1"));
    }
    descriptors_fit(
        limits,
        max_concurrent,
        crate::sandbox::descriptor_limit(),
        notes,
    )
}

/// The fewest handles a trial may be limited to: its preopened directories,
/// stdout and stderr streams and a few files.
const MIN_OPEN_FILES: u64 = 16;

/// How many trials may run at once without their open files taking the
/// host's file descriptors: `max_concurrent`, or fewer (with a note) when
/// the process's descriptor limit (`available`) cannot hold every trial's
/// `limits.open_files` plus the host's reserve.
fn descriptors_fit(
    limits: &Limits,
    max_concurrent: usize,
    available: u64,
    notes: &mut Vec<String>,
) -> Result<usize, ConfigError> {
    use crate::sandbox::{DESCRIPTORS_PER_TRIAL, HOST_DESCRIPTORS};
    let per_trial = limits.open_files.saturating_add(DESCRIPTORS_PER_TRIAL);
    let fit = available.saturating_sub(HOST_DESCRIPTORS) / per_trial;
    if fit == 0 {
        return Err(bad(format!(
            "this process may open {available} files (ulimit -n), too few for one trial's \
             limits.open_files ({}) plus the host's own {HOST_DESCRIPTORS}: lower \
             limits.open_files or raise the limit",
            limits.open_files
        )));
    }
    if fit < max_concurrent as u64 {
        notes.push(format!(
            "running at most {fit} trials at once (not {max_concurrent}): each may hold \
             limits.open_files = {} files and this process may open {available} (ulimit -n), \
             {HOST_DESCRIPTORS} of them kept for the host",
            limits.open_files
        ));
        return Ok(fit as usize);
    }
    Ok(max_concurrent)
}

/// [`units::fuel`], as a configuration error.
fn fuel(value: &toml::Value, key: &str) -> Result<Option<u64>, ConfigError> {
    units::fuel(value, key).map_err(bad)
}

/// [`units::size`], as a configuration error.
fn size(value: &toml::Value, key: &str) -> Result<u64, ConfigError> {
    units::size(value, key).map_err(bad)
}

/// [`units::duration`], as a configuration error.
fn duration(value: &toml::Value, key: &str) -> Result<Option<Duration>, ConfigError> {
    units::duration(value, key).map_err(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_taken_bare_or_as_wtune_inspect_prints_them() {
        let hex = "3fa4".repeat(16);
        for entry in [
            hex.clone(),
            format!("blake3:{hex}"),
            format!("  blake3: {}", hex.to_uppercase()),
        ] {
            let list =
                allowlist(std::slice::from_ref(&entry), "security.allowed_components").unwrap();
            assert_eq!(list, BTreeSet::from([hex.clone()]), "{entry:?}");
        }
        let short = allowlist(&[format!("blake3: {}", &hex[1..])], "k").unwrap_err();
        assert!(
            short.to_string().contains("is not a blake3 digest"),
            "{short}"
        );
    }
}

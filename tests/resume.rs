//! Checkpoints, recovery and `wtune resume` end to end through the `wtune`
//! binary, on the deterministic `stateful` guest: whatever interrupts a
//! trial, its final state (the `digest` of its heap) must equal that of an
//! uninterrupted run.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Four trials whose results depend only on their seed and iteration count.
fn experiment(dir: &Path, extra: &str, buffer_kib: u64, iterations: u64) -> PathBuf {
    let path = dir.join("experiment.toml");
    let text = format!(
        r#"
name = "stateful"
metric = "counter"
max_concurrent_trials = 2
{extra}
[stop]
training_iteration = {iterations}
[param_space]
seed = {{ grid_search = [1, 2, 3, 4] }}
buffer_kib = {buffer_kib}
iterations = 1000
"#
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn run(config: &Path, out: &Path) -> Output {
    common::wtune()
        .arg("run")
        .arg(common::guest("stateful"))
        .arg("--config")
        .arg(config)
        .args(["--seed", "1", "--output-dir"])
        .arg(out)
        .output()
        .unwrap()
}

fn ok(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    format!("{stdout}\n{stderr}")
}

/// `(trial_id, status, digest, iterations, num_failures)` per trial, from
/// `experiment.json`.
fn outcomes(out: &Path) -> Vec<(String, String, f64, u64, u64)> {
    common::experiment_trials(out)
        .iter()
        .map(|t| {
            (
                t["trial_id"].as_str().unwrap().to_string(),
                t["status"].as_str().unwrap().to_string(),
                t["last_result"]["digest"].as_f64().unwrap_or(-1.0),
                t["iterations"].as_u64().unwrap(),
                t["num_failures"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn digests(out: &Path) -> Vec<f64> {
    outcomes(out).into_iter().map(|o| o.2).collect()
}

#[test]
fn a_trap_at_iteration_k_recovers_under_max_failures_in_both_checkpoint_modes() {
    let dir = tempfile::tempdir().unwrap();
    let clean = experiment(dir.path(), "", 64, 8);
    ok(&run(&clean, &dir.path().join("clean")));
    let expected = digests(&dir.path().join("clean"));

    for mode in ["snapshot", "guest"] {
        let config = experiment(
            dir.path(),
            &format!(
                "checkpoint = \"{mode}\"\ncheckpoint_freq = 2\nmax_failures = 1\n[param_space.trap_at]\ngrid_search = [5]"
            ),
            64,
            8,
        );
        // A grid over one value keeps the four seeds as the only trials.
        let out = dir.path().join(mode);
        let log = ok(&run(&config, &out));
        let outcomes = outcomes(&out);
        for (id, status, _, iterations, failures) in &outcomes {
            assert_eq!(status, "TERMINATED", "{mode} {id}\n{log}");
            assert_eq!((*iterations, *failures), (8, 1), "{mode} {id}");
        }
        assert_eq!(digests(&out), expected, "{mode}");
        assert!(log.contains("failure 1 of 1"), "{log}");
        // The failure is in the trial's stderr; the trial kept going.
        assert!(
            out.join("trial_0000/checkpoints/checkpoint_000008.wtsnap")
                .is_file()
        );
    }

    // Without max_failures the same trap ends the trials in ERROR.
    let config = experiment(
        dir.path(),
        "[param_space.trap_at]\ngrid_search = [5]",
        64,
        8,
    );
    let out = dir.path().join("no-retries");
    let output = run(&config, &out);
    assert!(!output.status.success());
    assert!(outcomes(&out).iter().all(|o| o.1 == "ERROR"));
}

#[test]
fn sigkill_mid_run_then_resume_gives_the_uninterrupted_results() {
    let dir = tempfile::tempdir().unwrap();
    // Big enough heaps that the run lasts seconds, so the kill lands
    // mid-run even on a fast machine.
    let (buffer_kib, iterations) = (8192, 24);
    let clean = experiment(dir.path(), "", buffer_kib, iterations);
    ok(&run(&clean, &dir.path().join("clean")));
    let expected = digests(&dir.path().join("clean"));

    let config = experiment(dir.path(), "checkpoint_freq = 3", buffer_kib, iterations);
    let out = dir.path().join("killed");
    let mut child = common::wtune()
        .arg("run")
        .arg(common::guest("stateful"))
        .arg("--config")
        .arg(&config)
        .args(["--seed", "1", "--output-dir"])
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let first = out.join("trial_0000/checkpoints/checkpoint_000003.wtsnap");
    let previous = out.join("experiment_state.prev.json");
    let started = Instant::now();
    while !(first.exists() && previous.exists()) && started.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let state = std::fs::read_to_string(out.join("experiment_state.json")).unwrap();
    assert!(
        !state.contains("\"status\":\"finished\""),
        "the run finished before it could be killed; make it longer"
    );

    // What a kill in the middle of an atomic write leaves: the named
    // temporary file it was writing (whether this kill landed in one is
    // down to timing, so one is put there), which the resume removes.
    let left = [
        out.join(".wtune-tmp-state"),
        out.join("trial_0000/checkpoints/.wtune-tmp-snapshot"),
    ];
    for file in &left {
        std::fs::write(file, vec![0u8; 1 << 20]).unwrap();
    }

    // A damaged state file is named as such, and the previous one works.
    let good = std::fs::read(out.join("experiment_state.json")).unwrap();
    std::fs::write(out.join("experiment_state.json"), &good[..good.len() / 2]).unwrap();
    let output = common::wtune().arg("resume").arg(&out).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("experiment_state.json is damaged"),
        "{stderr}"
    );
    assert!(stderr.contains("--previous-state"), "{stderr}");

    // The previous state is older, but the checkpoints on disk are newer
    // than either, so nothing more is lost.
    let log = ok(&common::wtune()
        .arg("resume")
        .arg(&out)
        .arg("--previous-state")
        .output()
        .unwrap());
    assert!(log.contains("continue from checkpoints"), "{log}");
    for file in &left {
        assert!(!file.exists(), "{} is left", file.display());
    }
    let outcomes = outcomes(&out);
    for (id, status, _, iters, _) in &outcomes {
        assert_eq!(
            (status.as_str(), *iters),
            ("TERMINATED", iterations),
            "{id}"
        );
    }
    assert_eq!(digests(&out), expected);

    // Resuming a finished experiment changes nothing.
    let log = ok(&common::wtune().arg("resume").arg(&out).output().unwrap());
    assert!(log.contains("0 trials continue"), "{log}");
    assert_eq!(digests(&out), expected);
}

#[test]
fn restore_from_starts_new_trials_where_a_checkpoint_left_off() {
    let dir = tempfile::tempdir().unwrap();
    let one = |extra: &str, iterations: u64| {
        let path = dir.path().join(format!("one-{iterations}.toml"));
        std::fs::write(
            &path,
            format!(
                "metric = \"counter\"\n{extra}\n[stop]\ntraining_iteration = {iterations}\n\
                 [param_space]\nseed = 9\nbuffer_kib = 64\niterations = 1000\n"
            ),
        )
        .unwrap();
        path
    };
    ok(&run(&one("", 8), &dir.path().join("clean")));
    let expected = digests(&dir.path().join("clean"));
    ok(&run(
        &one("checkpoint_at_end = true", 4),
        &dir.path().join("first"),
    ));
    let checkpoint = dir
        .path()
        .join("first/trial_0000/checkpoints/checkpoint_000004.wtsnap");
    assert!(checkpoint.is_file());

    // A host snapshot carries its own configuration: a search space is refused.
    let refused = common::wtune()
        .arg("run")
        .arg(common::guest("stateful"))
        .arg("--config")
        .arg(one("", 8))
        .arg("--restore-from")
        .arg(&checkpoint)
        .arg("--output-dir")
        .arg(dir.path().join("refused"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("is a host snapshot"), "{stderr}");

    // Without one, the trial continues at iteration 5 with the snapshot's config.
    let out = dir.path().join("continued");
    let log = ok(&common::wtune()
        .arg("run")
        .arg(common::guest("stateful"))
        .args(["--metric", "counter", "--stop", "training_iteration=8"])
        .arg("--restore-from")
        .arg(&checkpoint)
        .arg("--output-dir")
        .arg(&out)
        .output()
        .unwrap());
    assert_eq!(digests(&out), expected, "{log}");
    let first_line = std::fs::read_to_string(out.join("trial_0000/result.jsonl")).unwrap();
    let first: Value = serde_json::from_str(first_line.lines().next().unwrap()).unwrap();
    assert_eq!(first["training_iteration"], 5);
    assert_eq!(first["iterations_since_restore"], 1);
    assert_eq!(first["config"]["seed"], 9);

    // Its sample count grows on resume, within the bound `wtune run` keeps.
    let state = std::fs::read(out.join("experiment_state.json")).unwrap();
    let refused = resume(&out, &["--num-samples", "100000000000"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "num_samples x grid size = 100000000000 trials, more than the 10000000 allowed"
        ),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(out.join("experiment_state.json")).unwrap(),
        state
    );
    ok(&resume(&out, &["--num-samples", "2"]));
    let second = std::fs::read_to_string(out.join("trial_0001/result.jsonl")).unwrap();
    let second: Value = serde_json::from_str(second.lines().next().unwrap()).unwrap();
    assert_eq!(
        (
            second["training_iteration"].as_u64(),
            second["config"]["seed"].as_u64()
        ),
        (Some(5), Some(9))
    );

    // A damaged checkpoint is refused with the reason, before anything runs.
    let mut bytes = std::fs::read(&checkpoint).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    let damaged = dir.path().join("damaged.wtsnap");
    std::fs::write(&damaged, &bytes).unwrap();
    let output = common::wtune()
        .arg("run")
        .arg(common::guest("stateful"))
        .arg("--restore-from")
        .arg(&damaged)
        .arg("--output-dir")
        .arg(dir.path().join("damaged"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("checksum does not match"), "{stderr}");
    assert!(!dir.path().join("damaged").exists());
}

#[test]
fn ctrl_c_checkpoints_and_resume_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (buffer_kib, iterations) = (8192, 24);
    let clean = experiment(dir.path(), "", buffer_kib, iterations);
    ok(&run(&clean, &dir.path().join("clean")));
    let expected = digests(&dir.path().join("clean"));

    // No periodic checkpoints: only the interrupt takes one.
    let out = dir.path().join("interrupted");
    let child = common::wtune()
        .arg("run")
        .arg(common::guest("stateful"))
        .arg("--config")
        .arg(&clean)
        .args(["--seed", "1", "--output-dir"])
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let results = out.join("trial_0000/result.jsonl");
    let started = Instant::now();
    while std::fs::read_to_string(&results).map_or(0, |t| t.lines().count()) < 2
        && started.elapsed() < Duration::from_secs(120)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("wtune resume"), "{stderr}");
    let paused = outcomes(&out);
    assert!(paused.iter().any(|o| o.1 == "PAUSED"), "{paused:?}");
    for (id, status, _, iters, _) in &paused {
        if status == "PAUSED" {
            let checkpoint = out.join(format!("{id}/checkpoints/checkpoint_{iters:06}.wtsnap"));
            assert!(
                checkpoint.is_file(),
                "{id} paused at {iters} with its checkpoint"
            );
        }
    }

    let log = ok(&common::wtune().arg("resume").arg(&out).output().unwrap());
    assert!(log.contains("continue from checkpoints"), "{log}");
    assert_eq!(digests(&out), expected);
}

/// Every file under `dir` with its bytes, but the lock file, in path order.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.file_name().is_some_and(|n| n != ".wtune.lock") {
                let bytes = std::fs::read(&path).unwrap();
                found.push((path, bytes));
            }
        }
    }
    found.sort();
    found
}

fn refused(output: &Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: ") && stderr.contains(expected),
        "{stderr}"
    );
}

/// `wtune resume` refuses another component and a directory that another
/// wtune holds before anything in the directory changes (a resume that
/// restarts errored trials deletes checkpoints); `wtune run` refuses a
/// snapshot key file too short to be a secret before writing anything.
#[test]
fn bad_resumes_and_short_keys_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // Every trial checkpoints at iteration 1 and traps at 2: ERROR, with a
    // checkpoint that `--restart-errored` would delete.
    let traps = "checkpoint_freq = 1\n[param_space.trap_at]\ngrid_search = [2]";
    let config = experiment(dir.path(), traps, 64, 3);
    let out = dir.path().join("out");
    let first = run(&config, &out);
    assert!(!first.status.success());
    let before = files(&out);
    assert!(
        before
            .iter()
            .any(|(p, _)| p.ends_with("experiment_state.json"))
    );
    assert!(
        before
            .iter()
            .any(|(p, _)| p.ends_with("trial_0000/checkpoints/checkpoint_000001.wtsnap")),
        "{:?}",
        before.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );

    let other = common::wtune()
        .arg("resume")
        .arg(&out)
        .arg("--model")
        .arg(common::guest("hostile"))
        .output()
        .unwrap();
    refused(&other, "is not the component the experiment ran");
    assert!(files(&out) == before, "a refused resume changed files");

    // This test plays the other wtune: it holds the directory's lock.
    let held = std::fs::OpenOptions::new()
        .write(true)
        .open(out.join(".wtune.lock"))
        .unwrap();
    held.try_lock().unwrap();
    for flags in [&[][..], &["--restart-errored"][..]] {
        let output = common::wtune()
            .arg("resume")
            .arg(&out)
            .args(flags)
            .output()
            .unwrap();
        refused(&output, "another wtune process is running the experiment");
        assert!(
            files(&out) == before,
            "{flags:?}: a refused resume changed files"
        );
    }
    drop(held);

    // An address in use refuses a resume and a run with a dashboard before
    // anything is written: the restarted trials' checkpoints are kept, and
    // no directory is made.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let serve = format!("--serve={}", taken.local_addr().unwrap());
    let output = common::wtune()
        .arg("resume")
        .arg(&out)
        .args(["--restart-errored", &serve])
        .output()
        .unwrap();
    refused(&output, "cannot listen on");
    assert!(files(&out) == before, "a refused resume changed files");
    let served_out = dir.path().join("served");
    let mut served = common::wtune();
    served
        .arg("run")
        .arg(common::guest("stateful"))
        .arg("--config");
    served
        .arg(&config)
        .arg(&serve)
        .arg("--output-dir")
        .arg(&served_out);
    let output = served.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("error: cannot listen on"), "{stderr}");
    assert!(!served_out.exists(), "nothing is written for a refused run");

    // A path the state file cannot keep as text is refused, named, before
    // anything is written.
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let odd = dir.path().join(std::ffi::OsStr::from_bytes(b"out-\xff"));
        let output = run(&config, &odd);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("out-\u{fffd} is not valid UTF-8"),
            "{stderr}"
        );
        assert!(!odd.exists(), "nothing is written for a refused run");
    }

    std::fs::write(dir.path().join("short.key"), b"12345678").unwrap();
    let keyed = experiment(dir.path(), "snapshot_key_file = \"short.key\"", 64, 2);
    let keyed_out = dir.path().join("keyed");
    refused(
        &run(&keyed, &keyed_out),
        "holds 8 bytes; use at least 16 bytes of secret",
    );
    assert!(!keyed_out.exists(), "nothing is written for a refused run");
}

/// Rewrites `out`'s saved state through `edit`, with a valid checksum, as
/// someone who can write the directory but holds no snapshot key could.
fn edit_state(out: &Path, edit: impl FnOnce(&mut Value)) {
    let path = out.join("experiment_state.json");
    let bytes = std::fs::read(&path).unwrap();
    let newline = bytes.iter().position(|&b| b == b'\n').unwrap();
    let mut state: Value = serde_json::from_slice(&bytes[newline + 1..]).unwrap();
    edit(&mut state);
    let body = serde_json::to_vec(&state).unwrap();
    let mut out = format!(
        "wtune-experiment-state 1 blake3={}\n",
        blake3::hash(&body).to_hex()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out.push(b'\n');
    std::fs::write(&path, out).unwrap();
}

/// The saved state names the directories a resume deletes in (a restarted
/// trial's checkpoints) and the files it renames over: a state edited so
/// that a trial's id or a checkpoint's path leads out of the experiment is
/// refused before anything, in or out of it, changes.
#[test]
fn a_state_that_leads_out_of_the_experiment_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let traps = "checkpoint_freq = 1\n[param_space.trap_at]\ngrid_search = [2]";
    let config = experiment(dir.path(), traps, 64, 3);
    let out = dir.path().join("out");
    assert!(!run(&config, &out).status.success());
    // Another experiment's trial, beside this one.
    let victim = dir.path().join("victim");
    std::fs::create_dir_all(victim.join("checkpoints")).unwrap();
    std::fs::write(
        victim.join("checkpoints/checkpoint_000001.wtsnap"),
        "keep me",
    )
    .unwrap();
    let victim_before = files(&victim);
    let state_file = out.join("experiment_state.json");
    let saved = std::fs::read(&state_file).unwrap();
    type Edit = fn(&mut Value);
    let edits: [(Edit, &str); 3] = [
        (
            |state| state["trials"][0]["trial_id"] = "../victim".into(),
            "names a trial \"../victim\", not `trial_` and digits",
        ),
        (
            |state| state["trials"][1]["trial_id"] = state["trials"][0]["trial_id"].clone(),
            "lists trial trial_0000 twice",
        ),
        (
            |state| {
                state["trials"][0]["checkpoints"][0]["path"] =
                    "../victim/checkpoints/checkpoint_000001.wtsnap".into()
            },
            "lists a checkpoint of trial_0000 at \"../victim/checkpoints/checkpoint_000001.wtsnap\"",
        ),
    ];
    for (edit, why) in edits {
        edit_state(&out, edit);
        let before = files(&out);
        let output = common::wtune()
            .arg("resume")
            .arg(&out)
            .arg("--restart-errored")
            .output()
            .unwrap();
        refused(&output, why);
        refused(&output, "nothing was changed");
        assert!(files(&out) == before, "a refused resume changed files");
        assert!(
            files(&victim) == victim_before,
            "a refused resume reached out"
        );
        std::fs::write(&state_file, &saved).unwrap();
    }
}

/// A checkpoint that is intact but unreadable as things stand (the snapshot
/// key file now holds another key) refuses the resume before anything
/// changes, rather than starting its trial over, which would cut its
/// results back to nothing; with the key back, the trials continue from it,
/// one whose newest checkpoint was corrupted (which, keyed, fails its MAC
/// as another key's would) from the one before.
#[test]
fn a_changed_snapshot_key_refuses_the_resume_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("snapshots.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    // Every trial checkpoints at iterations 1 and 2 and traps at 3.
    let extra = "checkpoint_freq = 1\nsnapshot_key_file = \"snapshots.key\"\n\
                 [param_space.trap_at]\ngrid_search = [3]";
    let config = experiment(dir.path(), extra, 64, 3);
    let out = dir.path().join("out");
    assert!(!run(&config, &out).status.success());
    let before = files(&out);

    // The state is sealed with the key too: it names the model, the data
    // granted, the limits and the key file, and a state edited by one byte
    // is refused...
    let state_file = out.join("experiment_state.json");
    let sealed = std::fs::read(&state_file).unwrap();
    assert!(sealed.starts_with(b"wtune-experiment-state 1 mac="));
    let written = b"\"written\":\"2";
    let at = sealed
        .windows(written.len())
        .position(|w| w == written)
        .unwrap();
    let mut edited = sealed.clone();
    edited[at + written.len() - 1] = b'1';
    std::fs::write(&state_file, &edited).unwrap();
    let output = common::wtune().arg("resume").arg(&out).output().unwrap();
    refused(&output, "MAC does not match the snapshot key");
    // ... and, with the key given on the command line, so is one whose seal
    // was swapped for a plain checksum by someone who cannot make the MAC.
    edit_state(&out, |state| {
        state["setup"]["snapshot_key_file"] = Value::Null
    });
    let output = common::wtune()
        .arg("resume")
        .arg(&out)
        .arg("--snapshot-key-file")
        .arg(&key)
        .output()
        .unwrap();
    refused(&output, "carries no MAC");
    refused(&output, "nothing was changed");
    std::fs::write(&state_file, &sealed).unwrap();
    assert!(files(&out) == before, "a refused resume changed files");

    std::fs::write(&key, [8u8; 32]).unwrap();
    let resume = || {
        common::wtune()
            .arg("resume")
            .arg(&out)
            .arg("--retry-errored")
            .output()
            .unwrap()
    };
    let rotated = resume();
    refused(&rotated, "sealed with another key");
    refused(&rotated, "nothing was changed");
    assert!(files(&out) == before, "a refused resume changed files");

    std::fs::write(&key, [7u8; 32]).unwrap();
    let corrupted = out.join("trial_0001/checkpoints/checkpoint_000002.wtsnap");
    let mut bytes = std::fs::read(&corrupted).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&corrupted, bytes).unwrap();
    let resumed = resume();
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(
        stderr.contains("4 trials continue from checkpoints, 0 start over")
            && stderr.contains("skipping damaged checkpoint")
            && stderr.contains("checkpoint_000002.wtsnap"),
        "{stderr}"
    );
    // Continued, not started over: iteration 1's result is the first run's.
    let first_line = |bytes: &[u8]| {
        String::from_utf8_lossy(bytes)
            .lines()
            .next()
            .map(String::from)
    };
    let results = out.join("trial_0000/result.jsonl");
    let (_, was) = before.iter().find(|(path, _)| *path == results).unwrap();
    assert_eq!(
        first_line(&std::fs::read(&results).unwrap()),
        first_line(was)
    );
    let (from_jsonl, from_csv) = iterations_in_files(&out.join("trial_0000"));
    assert_eq!(from_jsonl, from_csv);
    assert_eq!(from_jsonl.first(), Some(&1));
}

/// `training_iteration` of every line of a trial's `result.jsonl`, and of
/// every row of its `progress.csv`, in file order.
fn iterations_in_files(trial: &Path) -> (Vec<u64>, Vec<u64>) {
    let jsonl = std::fs::read_to_string(trial.join("result.jsonl")).unwrap();
    let from_jsonl = jsonl
        .lines()
        .map(|line| {
            let result: Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            result["training_iteration"].as_u64().unwrap()
        })
        .collect();
    let mut reader = csv::Reader::from_path(trial.join("progress.csv")).unwrap();
    let column = reader
        .headers()
        .unwrap()
        .iter()
        .position(|h| h == "training_iteration")
        .unwrap();
    let from_csv = reader
        .records()
        .map(|row| row.unwrap()[column].parse().unwrap())
        .collect();
    (from_jsonl, from_csv)
}

#[test]
fn random_kills_and_resumes_end_with_the_uninterrupted_results_once_each() {
    use rand::{Rng, SeedableRng};

    let dir = tempfile::tempdir().unwrap();
    // About two seconds of training on this project's machines.
    let (buffer_kib, iterations) = (4096, 16);
    let clean = experiment(dir.path(), "", buffer_kib, iterations);
    let began = Instant::now();
    ok(&run(&clean, &dir.path().join("clean")));
    let clean_time = began.elapsed().max(Duration::from_millis(200));
    let expected = digests(&dir.path().join("clean"));

    let config = experiment(dir.path(), "checkpoint_freq = 2", buffer_kib, iterations);
    let out = dir.path().join("killed");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(26);
    let mut kills = 0;
    let mut finished = false;
    for attempt in 0..40 {
        // Killed before its first state was written, an experiment has
        // nothing to resume: it is run again.
        let mut command = common::wtune();
        if out.join("experiment_state.json").exists() {
            command.arg("resume").arg(&out);
        } else {
            let _ = std::fs::remove_dir_all(&out);
            command
                .arg("run")
                .arg(common::guest("stateful"))
                .arg("--config")
                .arg(&config)
                .args(["--seed", "1", "--output-dir"])
                .arg(&out);
        }
        let mut child = command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // The first kills land within the first second, some at once;
        // later ones anywhere in a run's length; the last attempts run to
        // the end.
        let delay = match attempt {
            0 => Duration::ZERO,
            1..=3 => clean_time
                .min(Duration::from_secs(1))
                .mul_f64(rng.random_range(0.0..0.3)),
            4..=11 => clean_time.mul_f64(rng.random_range(0.05..0.6)),
            _ => Duration::from_secs(600),
        };
        let started = Instant::now();
        let exited = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if started.elapsed() >= delay {
                break None;
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        match exited {
            Some(status) => {
                assert!(status.success(), "attempt {attempt} failed: {status}");
                finished = true;
                break;
            }
            None => {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                kills += 1;
            }
        }
    }
    assert!(finished, "the experiment never finished");
    assert!(kills >= 4, "only {kills} kills landed: make the run longer");

    let outcomes = outcomes(&out);
    assert_eq!(outcomes.len(), 4, "{outcomes:?}");
    for (id, status, _, iters, _) in &outcomes {
        assert_eq!(
            (status.as_str(), *iters),
            ("TERMINATED", iterations),
            "{id}"
        );
        let (jsonl, csv) = iterations_in_files(&out.join(id));
        let once: Vec<u64> = (1..=iterations).collect();
        assert_eq!(jsonl, once, "{id}: result.jsonl after {kills} kills");
        assert_eq!(csv, once, "{id}: progress.csv after {kills} kills");
    }
    assert_eq!(digests(&out), expected, "after {kills} kills");
}

/// The experiment run to iteration 3 in `dir/extended`, each trial
/// checkpointed at its end, and the digests a run to 6 ends with.
fn ended_at_3_and_digests_at_6(dir: &Path) -> (PathBuf, Vec<f64>) {
    let longer = experiment(dir, "", 64, 6);
    ok(&run(&longer, &dir.join("longer")));
    let expected = digests(&dir.join("longer"));
    let config = experiment(dir, "checkpoint_at_end = true", 64, 3);
    let out = dir.join("extended");
    ok(&run(&config, &out));
    (out, expected)
}

#[test]
fn resume_with_new_stopping_criteria_extends_a_finished_run() {
    // Four trials end at iteration 3 (checkpointed at their end); resumed
    // with `--stop training_iteration=6` they continue from those
    // checkpoints to 6, ending where a run to 6 ends, each iteration once.
    let dir = tempfile::tempdir().unwrap();
    let (out, expected) = ended_at_3_and_digests_at_6(dir.path());
    assert!(outcomes(&out).iter().all(|o| o.3 == 3));
    let resumed = common::wtune()
        .arg("resume")
        .arg(&out)
        .args(["--stop", "training_iteration=6"])
        .output()
        .unwrap();
    let said = ok(&resumed);
    assert!(
        said.contains("extending 4 finished trials under the new stopping criteria"),
        "{said}"
    );
    for (id, status, _, iterations, _) in outcomes(&out) {
        assert_eq!((status.as_str(), iterations), ("TERMINATED", 6), "{id}");
        let (jsonl, csv) = iterations_in_files(&out.join(&id));
        assert_eq!(jsonl, (1..=6).collect::<Vec<u64>>(), "{id}");
        assert_eq!(csv, (1..=6).collect::<Vec<u64>>(), "{id}");
    }
    assert_eq!(digests(&out), expected);

    // A bad criterion is refused before anything changes.
    let refused = common::wtune()
        .arg("resume")
        .arg(&out)
        .args(["--stop", "training_iteration=many"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("is not a finite number"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(outcomes(&out).iter().all(|o| o.3 == 6));

    // So is a criterion on a metric the trials do not report (a typo):
    // saved, it would end every later extension in an error.
    let state = std::fs::read(out.join("experiment_state.json")).unwrap();
    let refused = common::wtune()
        .arg("resume")
        .arg(&out)
        .args([
            "--stop",
            "training_iteration=6",
            "--stop",
            "training_iterations=9",
        ])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("`training_iterations` names a metric the trainable does not report")
            && said.contains("nothing was changed"),
        "{said}"
    );
    assert_eq!(
        std::fs::read(out.join("experiment_state.json")).unwrap(),
        state
    );
    let extended = common::wtune()
        .arg("resume")
        .arg(&out)
        .args(["--stop", "training_iteration=7"])
        .output()
        .unwrap();
    ok(&extended);
    assert!(outcomes(&out).iter().all(|o| o.3 == 7));
}

#[test]
fn an_extended_trial_teaches_the_searcher_its_new_final_result() {
    // TPE learned each trial's `counter` at iteration 3, where they ended.
    // Extended to 6, the trials' results there must replace those, as if
    // the run had gone to 6 from the start: before, the searcher ignored
    // everything an extended trial reported and kept the stale 3s.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("experiment.toml");
    std::fs::write(
        &config,
        r#"
name = "stateful"
metric = "counter"
max_concurrent_trials = 2
num_samples = 4
checkpoint_at_end = true
search = "tpe"
[stop]
training_iteration = 3
[param_space]
seed = { choice = [1, 2, 3, 4] }
buffer_kib = 64
iterations = 1000
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    ok(&run(&config, &out));
    let learned = |out: &Path| {
        let saved = wtune::report::state::load(out, false).unwrap().unchecked();
        let searcher = saved.decisions.searcher.expect("TPE saves its state");
        let state = searcher.state;
        let observations = &state["observations"];
        let mut seen: Vec<(String, f64)> = observations
            .as_array()
            .unwrap_or_else(|| panic!("no observations in {state}"))
            .iter()
            .map(|o| {
                let trial = o["trial"].as_str().unwrap().to_string();
                (trial, o["metric"].as_f64().unwrap())
            })
            .collect();
        seen.sort_by(|a, b| a.0.cmp(&b.0));
        seen
    };
    let ids: Vec<String> = outcomes(&out).into_iter().map(|o| o.0).collect();
    let at = |metric: f64| {
        ids.iter()
            .map(|id| (id.clone(), metric))
            .collect::<Vec<_>>()
    };
    assert_eq!(learned(&out), at(3.0));
    ok(&resume(&out, &["--stop", "training_iteration=6"]));
    assert!(outcomes(&out).iter().all(|o| o.3 == 6));
    assert_eq!(learned(&out), at(6.0));
}

#[test]
fn an_extended_trial_that_fails_goes_on_when_retried() {
    // Extended under new criteria with a fuel budget they have already
    // spent, the trials end in ERROR before their next checkpoint: their
    // newest one is still the result that ended them, which says `done`.
    // Retried under a larger budget, they go on to the new criteria from
    // it, as the extension would have, rather than ending there again.
    let dir = tempfile::tempdir().unwrap();
    let (out, expected) = ended_at_3_and_digests_at_6(dir.path());
    resume(&out, &["--stop", "training_iteration=6", "--fuel", "1"]);
    for (id, status, _, iterations, _) in outcomes(&out) {
        assert_eq!((status.as_str(), iterations), ("ERROR", 3), "{id}");
    }
    ok(&resume(&out, &["--retry-errored", "--fuel", "1e12"]));
    for (id, status, _, iterations, _) in outcomes(&out) {
        assert_eq!((status.as_str(), iterations), ("TERMINATED", 6), "{id}");
        let (jsonl, _) = iterations_in_files(&out.join(&id));
        assert_eq!(jsonl, (1..=6).collect::<Vec<u64>>(), "{id}");
    }
    assert_eq!(digests(&out), expected);
}

/// Each trial's config, in trial order, from `experiment.json`.
fn configs(out: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(out.join("experiment.json")).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    doc["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["config"].clone())
        .collect()
}

fn resume(out: &Path, flags: &[&str]) -> Output {
    common::wtune()
        .arg("resume")
        .arg(out)
        .args(flags)
        .output()
        .unwrap()
}

#[test]
fn resume_with_more_samples_adds_the_trials_a_larger_run_would_have_made() {
    // A random parameter beside the grid, so that each sample's trials
    // differ: the added ones must be those a run with the larger count
    // draws, numbered after the saved ones, which are left as they were.
    let dir = tempfile::tempdir().unwrap();
    let random = "[param_space.reserve_mib]\nrandint = [0, 3]";
    let config = experiment(dir.path(), random, 64, 3);
    let larger = dir.path().join("larger");
    let mut run_larger = common::wtune();
    run_larger
        .arg("run")
        .arg(common::guest("stateful"))
        .arg("--config")
        .arg(&config)
        .args(["--seed", "1", "--num-samples", "3", "--output-dir"])
        .arg(&larger);
    ok(&run_larger.output().unwrap());

    let out = dir.path().join("grown");
    ok(&run(&config, &out));
    assert_eq!(outcomes(&out).len(), 4);
    let first_trial = std::fs::read(out.join("trial_0000/result.jsonl")).unwrap();
    let said = ok(&resume(&out, &["--num-samples", "3"]));
    assert!(said.contains("num_samples 1 -> 3"), "{said}");
    assert_eq!(configs(&out), configs(&larger));
    assert_eq!(digests(&out), digests(&larger));
    let ids: Vec<String> = outcomes(&out).into_iter().map(|o| o.0).collect();
    assert_eq!(
        ids,
        (0..12).map(|i| format!("trial_{i:04}")).collect::<Vec<_>>()
    );
    assert!(
        outcomes(&out)
            .iter()
            .all(|o| o.1 == "TERMINATED" && o.3 == 3)
    );
    assert_eq!(
        std::fs::read(out.join("trial_0000/result.jsonl")).unwrap(),
        first_trial
    );

    // Fewer samples than trials already made cannot be.
    let before = files(&out);
    refused(
        &resume(&out, &["--num-samples", "2"]),
        "--num-samples 2 makes 8 trials, but the experiment has created 12 already",
    );
    assert!(files(&out) == before, "a refused resume changed files");
}

#[test]
fn resume_refuses_flags_for_what_the_experiment_keeps_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let config = experiment(dir.path(), "", 64, 2);
    let out = dir.path().join("out");
    ok(&run(&config, &out));
    let before = files(&out);
    for (flags, why) in [
        (
            &["--config", "experiment.toml"][..],
            "reads no experiment file",
        ),
        (
            &["--metric", "digest"][..],
            "the trials were ranked by `counter` (max)",
        ),
        (&["--mode", "min"][..], "--metric and --mode cannot change"),
        (&["--seed", "2"][..], "follow the saved seed 1"),
        (
            &["--scheduler", "asha"][..],
            "--scheduler and --search cannot change",
        ),
        (
            &["--search", "tpe"][..],
            "--scheduler and --search cannot change",
        ),
        (&["--checkpoint", "guest"][..], "written in snapshot mode"),
        (&["--data", "d=."][..], "--data cannot change"),
        (&["--name", "other"][..], "keeps its name (stateful)"),
        (
            &["--restore-from", "x.wtsnap"][..],
            "each trial continues from its own",
        ),
        (&["--memory", "lots"][..], "--memory must be a size"),
        (
            &["--max-concurrent", "0"][..],
            "--max-concurrent must be at least 1",
        ),
        (
            &["--compute", "tpu"][..],
            "--compute \"tpu\" is not a backend; use auto, cpu or gpu",
        ),
    ] {
        refused(&resume(&out, flags), why);
        assert!(
            files(&out) == before,
            "{flags:?}: a refused resume changed files"
        );
    }
}

#[test]
fn resume_with_a_larger_fuel_budget_lets_trials_that_ran_out_go_on() {
    // Setup burns about 0.27e6 fuel and each iteration 0.3e6: a budget of
    // 1e6 ends every trial in its third iteration, after the checkpoint
    // at its second.
    let dir = tempfile::tempdir().unwrap();
    let config = experiment(dir.path(), "checkpoint_freq = 1", 64, 3);
    let expected = dir.path().join("expected");
    ok(&run(&config, &expected));

    let out = dir.path().join("out");
    let mut short = common::wtune();
    short
        .arg("run")
        .arg(common::guest("stateful"))
        .arg("--config")
        .arg(&config)
        .args(["--seed", "1", "--fuel", "1e6", "--output-dir"])
        .arg(&out);
    let first = short.output().unwrap();
    assert!(!first.status.success());
    assert!(outcomes(&out).iter().all(|o| o.1 == "ERROR" && o.3 == 2));

    let said = ok(&resume(
        &out,
        &["--retry-errored", "--fuel", "1e8", "--memory", "96MiB"],
    ));
    assert!(
        said.contains("from now on, limits per trial: memory 96 MiB")
            && said.contains("1e8 per trial"),
        "{said}"
    );
    assert!(
        outcomes(&out)
            .iter()
            .all(|o| o.1 == "TERMINATED" && o.3 == 3)
    );
    assert_eq!(digests(&out), digests(&expected));
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("experiment.json")).unwrap())
            .unwrap();
    assert_eq!(doc["run"]["limits"]["fuel_per_trial"], 100_000_000);
    assert_eq!(doc["run"]["limits"]["memory_bytes"], 96 << 20);
}

//! `wtune new`: the crate it creates builds outside this repository, with
//! Cargo offline, and `wtune run` tunes it with its own experiment file, as
//! a newcomer would follow its README. Bad input is refused and changes
//! nothing.

mod common;

use std::path::Path;
use std::process::Command;

use common::{workspace, wtune};
use serde_json::Value;

/// Cargo as the test runner's own (the same toolchain that built the SDK).
fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

fn check(output: &std::process::Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_new_trainable_builds_offline_and_tunes_with_its_experiment_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("wtune-new-check");
    let out = wtune()
        .current_dir(tmp.path())
        .args(["new", "wtune-new-check"])
        .output()
        .unwrap();
    check(&out, "wtune new");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("cargo build --release --target wasm32-wasip2"),
        "{said}"
    );
    assert!(
        said.contains("target/wasm32-wasip2/release/wtune_new_check.wasm"),
        "{said}"
    );
    for file in [
        "Cargo.toml",
        "Cargo.lock",
        "rust-toolchain.toml",
        ".gitignore",
        "src/lib.rs",
        "experiment.toml",
        "README.md",
    ] {
        assert!(dir.join(file).is_file(), "{file} is missing");
    }
    // The template is formatted as `cargo fmt` would leave it.
    let fmt = Command::new("rustfmt")
        .args(["--check", "--edition", "2024"])
        .arg(dir.join("src/lib.rs"))
        .output()
        .unwrap();
    check(&fmt, "rustfmt --check");

    // The build the README says, offline: every crate comes from the lock,
    // pinned to what the workspace was built with. The workspace's target
    // directory is shared so that those crates are not compiled again.
    let target = workspace().join("target");
    let build = cargo()
        .current_dir(&dir)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--offline",
        ])
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    check(&build, "cargo build");
    let wasm = target.join("wasm32-wasip2/release/wtune_new_check.wasm");
    let inspect = wtune().arg("inspect").arg(&wasm).output().unwrap();
    check(&inspect, "wtune inspect");

    let results = tmp.path().join("results");
    let run = wtune()
        .current_dir(&dir)
        .arg("run")
        .arg(&wasm)
        .args(["--config", "experiment.toml", "--output-dir"])
        .arg(&results)
        .output()
        .unwrap();
    check(&run, "wtune run");
    let experiment: Value =
        serde_json::from_slice(&std::fs::read(results.join("experiment.json")).unwrap()).unwrap();
    let trials = experiment["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 12);
    let iterations = |t: &Value| t["last_result"]["training_iteration"].as_u64().unwrap();
    assert!(
        trials.iter().all(|t| t["status"] == "TERMINATED"),
        "{experiment:#}"
    );
    // ASHA stopped some trials at the grace period; others ran to the end.
    assert!(trials.iter().any(|t| iterations(t) == 3));
    assert!(trials.iter().any(|t| iterations(t) == 30));
    // A real model learned: the best trial predicts the noisy labels far
    // better than chance.
    let best = &experiment["best_trial"]["trial_id"];
    let best = trials.iter().find(|t| &t["trial_id"] == best).unwrap();
    let accuracy = best["last_result"]["val_accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.75, "best val_accuracy {accuracy}");
}

#[test]
fn bad_input_to_new_is_refused_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let refused = |args: &[&str], says: &str| {
        let out = wtune().current_dir(tmp.path()).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    };
    refused(&["new", "1model"], "cannot name a crate");
    refused(&["new", "my model"], "cannot name a crate");
    refused(&["new", "serde"], "one of the crate's dependencies");
    refused(
        &["new", "m", "--sdk", tmp.path().to_str().unwrap()],
        "does not hold the wtune-guest crate",
    );
    let entries = |dir: &Path| std::fs::read_dir(dir).unwrap().count();
    assert_eq!(entries(tmp.path()), 0, "a refusal left files behind");

    // A directory with the user's files in it is never written into.
    let taken = tmp.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("notes.txt"), "mine").unwrap();
    refused(&["new", "taken"], "exists and is not empty");
    assert_eq!(entries(&taken), 1);
    assert_eq!(
        std::fs::read_to_string(taken.join("notes.txt")).unwrap(),
        "mine"
    );
    std::fs::write(tmp.path().join("file"), "").unwrap();
    refused(&["new", "m", "--dir", "file"], "is not a directory");
    assert_eq!(entries(tmp.path()), 2, "a refusal left files behind");

    // An empty directory is filled in, as `cargo new` does with `--dir`.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = wtune()
        .current_dir(tmp.path())
        .args(["new", "m", "--dir", "empty"])
        .output()
        .unwrap();
    check(&out, "wtune new into an empty directory");
    assert!(empty.join("src/lib.rs").is_file());

    // `.` (the shell's own directory, which cannot be renamed over) is
    // filled in place: the same directory, with its own permissions.
    let here = tmp.path().join("here");
    std::fs::create_dir(&here).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&here, std::fs::Permissions::from_mode(0o750)).unwrap();
    }
    let before = std::fs::metadata(&here).unwrap();
    let out = wtune()
        .current_dir(&here)
        .args(["new", "m", "--dir", "."])
        .output()
        .unwrap();
    check(&out, "wtune new --dir .");
    assert!(here.join("src/lib.rs").is_file() && here.join("Cargo.lock").is_file());
    let after = std::fs::metadata(&here).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        assert_eq!(after.ino(), before.ino(), "the directory was replaced");
        assert_eq!(after.permissions().mode() & 0o777, 0o750);
    }
    let hidden: Vec<_> = std::fs::read_dir(&here)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(".wtune-new-"))
        .collect();
    assert!(hidden.is_empty(), "{hidden:?}");
    refused(&["new", "m", "--dir", ""], "a value is required for '--dir");
}

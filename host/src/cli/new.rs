//! `wtune new NAME`: a trainable crate to start from. It builds outside this
//! repository: the SDK is a path dependency on the sources this wtune was
//! built from (or `--sdk DIR`), and its Cargo.lock pins the versions wtune
//! was tested with, so the first build needs no network when those crates
//! are in Cargo's cache.

mod lock;

use std::path::{Path, PathBuf};

use super::Failure;
use super::args::NewArgs;

/// The SDK beside the host crate this binary was built from.
const BUILT_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../guest-sdk");

/// The workspace's lock: the versions the SDK was built and tested with.
const WORKSPACE_LOCK: &str = include_str!("../../../Cargo.lock");

/// The template's files: (path in the crate, contents with `{{name}}`,
/// `{{crate}}` and `{{sdk}}` to fill in).
const TEMPLATE: [(&str, &str); 6] = [
    ("Cargo.toml", include_str!("new/template/Cargo.toml.in")),
    (
        "rust-toolchain.toml",
        include_str!("new/template/rust-toolchain.toml"),
    ),
    (".gitignore", include_str!("new/template/gitignore")),
    ("src/lib.rs", include_str!("new/template/lib.rs")),
    (
        "experiment.toml",
        include_str!("new/template/experiment.toml"),
    ),
    ("README.md", include_str!("new/template/README.md")),
];

/// The entry point of `wtune new`: checks everything, writes the crate into
/// a hidden directory beside the target and moves it into place, so a
/// refusal or a failed write leaves nothing behind.
pub(super) fn new_trainable(args: NewArgs) -> Result<(), Failure> {
    let name = checked_name(&args.name)?;
    let dir = args.dir.unwrap_or_else(|| PathBuf::from(name));
    check_target(&dir)?;
    let sdk = sdk_dir(args.sdk)?;
    let lock = lock::pruned(WORKSPACE_LOCK, &["wtune-guest", "serde"])
        .map_err(|e| Failure::runtime(format!("the SDK's Cargo.lock: {e}")))?;
    let files = render(name, &sdk, lock);
    write_atomically(&dir, &files)?;
    let wasm = format!(
        "target/wasm32-wasip2/release/{}.wasm",
        name.replace('-', "_")
    );
    println!("created {} in {}", name, dir.display());
    println!("build and tune it:");
    println!("  cd {}", dir.display());
    println!("  cargo build --release --target wasm32-wasip2");
    println!("  wtune run {wasm} --config experiment.toml");
    Ok(())
}

/// `name` when Cargo takes it as a package name and its library's file
/// name is `name` with `_` for `-`.
fn checked_name(name: &str) -> Result<&str, Failure> {
    let mut chars = name.chars();
    let starts_with_letter = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !starts_with_letter || !rest_ok {
        return Err(Failure::user(format!(
            "`{name}` cannot name a crate: use letters, digits, `-` and `_`, starting with a \
             letter (e.g. `my-model`)"
        )));
    }
    // The crate depends on these by name; Cargo refuses a package that
    // shares a name with its dependency.
    if ["wtune-guest", "wtune_guest", "serde"].contains(&name) {
        return Err(Failure::user(format!(
            "`{name}` is the name of one of the crate's dependencies: choose another"
        )));
    }
    Ok(name)
}

/// Refuses a target that holds anything: nothing of the user's is replaced.
fn check_target(dir: &Path) -> Result<(), Failure> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(Failure::user(format!(
                    "{} exists and is not empty; choose another name or --dir",
                    dir.display()
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => Err(Failure::user(format!(
            "{} exists and is not a directory",
            dir.display()
        ))),
        Err(e) => Err(Failure::runtime(format!(
            "cannot read {}: {e}",
            dir.display()
        ))),
    }
}

/// The SDK's directory, made absolute (the crate may be built from
/// anywhere), after checking it holds the wtune-guest crate.
fn sdk_dir(given: Option<PathBuf>) -> Result<PathBuf, Failure> {
    let flag = given.is_some();
    let dir = given.unwrap_or_else(|| PathBuf::from(BUILT_SDK));
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
    let is_sdk = manifest
        .parse::<toml::Table>()
        .ok()
        .and_then(|t| t.get("package")?.get("name")?.as_str().map(str::to_owned))
        .is_some_and(|n| n == "wtune-guest");
    if !is_sdk {
        let hint = if flag {
            ""
        } else {
            " (the sources this wtune was built from moved): pass the SDK's directory, \
             guest-sdk/ in wtune's repository, with --sdk DIR"
        };
        return Err(Failure::user(format!(
            "{} does not hold the wtune-guest crate{hint}",
            dir.display()
        )));
    }
    let dir = dir
        .canonicalize()
        .map_err(|e| Failure::runtime(format!("cannot resolve {}: {e}", dir.display())))?;
    Ok(dir)
}

/// The crate's files, the template filled in, plus the pruned lock.
fn render(name: &str, sdk: &Path, lock: String) -> Vec<(&'static str, String)> {
    // A TOML string, quoted and escaped, whatever the path holds.
    let sdk_path = toml::Value::String(sdk.to_string_lossy().into_owned()).to_string();
    let sdk = format!("{{ path = {sdk_path} }}");
    let crate_name = name.replace('-', "_");
    let mut files: Vec<(&str, String)> = TEMPLATE
        .iter()
        .map(|(path, text)| {
            let text = text
                .replace("{{name}}", name)
                .replace("{{crate}}", &crate_name)
                .replace("{{sdk}}", &sdk);
            (*path, text)
        })
        .collect();
    files.push(("Cargo.lock", lock));
    files
}

/// Writes `files` into a fresh hidden directory beside `dir`, then renames
/// it to `dir` (which is absent or empty). An empty directory that exists
/// is filled in place instead ([`fill_in_place`]).
fn write_atomically(dir: &Path, files: &[(&str, String)]) -> Result<(), Failure> {
    if dir.is_dir() {
        return fill_in_place(dir, files);
    }
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent)
        .map_err(|e| Failure::runtime(format!("cannot create {}: {e}", parent.display())))?;
    let staging = staged(&parent, files)?;
    // rename(2) replaces an empty directory, and refuses a full one that
    // appeared since the check.
    std::fs::rename(staging.path(), dir)
        .map_err(|e| Failure::runtime(format!("cannot create {}: {e}", dir.display())))?;
    // Renamed away: nothing is left for the guard to delete.
    let _ = staging.keep();
    Ok(())
}

/// `files` written into a fresh hidden directory in `parent`, deleted when
/// dropped.
fn staged(parent: &Path, files: &[(&str, String)]) -> Result<tempfile::TempDir, Failure> {
    let staging = tempfile::Builder::new()
        .prefix(".wtune-new-")
        .tempdir_in(parent)
        .map_err(|e| Failure::runtime(format!("cannot write in {}: {e}", parent.display())))?;
    for (path, text) in files {
        let path = staging.path().join(path);
        if let Some(folder) = path.parent() {
            std::fs::create_dir_all(folder).map_err(|e| {
                Failure::runtime(format!("cannot create {}: {e}", folder.display()))
            })?;
        }
        std::fs::write(&path, text)
            .map_err(|e| Failure::runtime(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(staging)
}

/// Fills the empty directory `dir` (`.`, the shell's directory, one the
/// user made with its own permissions) without replacing it: renaming a
/// directory over it would fail for `.`, and elsewhere swap in another
/// directory with other permissions under a shell that stands in the old.
/// The files are staged inside it and moved up one by one; a move that
/// fails takes back those made before it.
fn fill_in_place(dir: &Path, files: &[(&str, String)]) -> Result<(), Failure> {
    let staging = staged(dir, files)?;
    let mut tops: Vec<&str> = files
        .iter()
        .map(|(path, _)| path.split('/').next().unwrap_or(path))
        .collect();
    tops.sort_unstable();
    tops.dedup();
    let mut moved: Vec<PathBuf> = Vec::new();
    for top in tops {
        let to = dir.join(top);
        if let Err(e) = std::fs::rename(staging.path().join(top), &to) {
            for done in moved.iter().rev() {
                let _ = std::fs::rename(
                    done,
                    staging.path().join(done.strip_prefix(dir).unwrap_or(done)),
                );
            }
            return Err(Failure::runtime(format!(
                "cannot create {}: {e}",
                to.display()
            )));
        }
        moved.push(to);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cargo_refuses_are_refused() {
        for bad in [
            "",
            "1model",
            "my model",
            "-x",
            "é",
            "wtune-guest",
            "serde",
            "a/b",
        ] {
            assert!(checked_name(bad).is_err(), "{bad:?}");
        }
        for good in ["m", "my-model", "my_model2", "Model"] {
            assert_eq!(checked_name(good).ok(), Some(good));
        }
    }

    #[test]
    fn every_placeholder_is_filled() {
        let files = render("my-model", Path::new("/sdk \"dir\""), String::new());
        for (path, text) in &files {
            assert!(!text.contains("{{"), "{path} keeps a placeholder");
        }
        let manifest: toml::Table = files[0].1.parse().unwrap();
        let sdk = &manifest["dependencies"]["wtune-guest"]["path"];
        assert_eq!(sdk.as_str(), Some("/sdk \"dir\""));
        assert_eq!(manifest["package"]["name"].as_str(), Some("my-model"));
    }
}

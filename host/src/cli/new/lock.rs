//! A Cargo.lock cut down to what some of its packages depend on.

use std::collections::BTreeSet;

/// The packages of `lock` that `roots` (package names) reach through
/// their dependencies, in the lock's own text and order. Cargo adds the
/// new crate's own entry on its first build.
pub(super) fn pruned(lock: &str, roots: &[&str]) -> Result<String, String> {
    let parsed: toml::Table = lock.parse().map_err(|e| format!("{e}"))?;
    let packages = parsed
        .get("package")
        .and_then(|p| p.as_array())
        .ok_or("no [[package]] entries")?;
    let ids: Vec<(String, String)> = packages
        .iter()
        .map(|p| {
            let field = |k: &str| p.get(k).and_then(|v| v.as_str()).unwrap_or("").to_owned();
            (field("name"), field("version"))
        })
        .collect();
    let find = |spec: &str| -> Result<usize, String> {
        // "name", or "name version" where the lock holds several versions
        // (a source may follow; one registry here, so it is not needed).
        let mut words = spec.split(' ');
        let name = words.next().unwrap_or("");
        let version = words.next();
        let mut matches = ids
            .iter()
            .enumerate()
            .filter(|(_, (n, v))| n == name && version.is_none_or(|want| want == v));
        match (matches.next(), matches.next()) {
            (Some((i, _)), None) => Ok(i),
            (None, _) => Err(format!("`{spec}` is not in the lock")),
            (Some(_), Some(_)) => Err(format!("`{spec}` names several packages")),
        }
    };
    let mut kept = BTreeSet::new();
    let mut todo = roots
        .iter()
        .map(|r| find(r))
        .collect::<Result<Vec<_>, _>>()?;
    while let Some(i) = todo.pop() {
        if !kept.insert(i) {
            continue;
        }
        let deps = packages[i].get("dependencies").and_then(|d| d.as_array());
        for dep in deps.into_iter().flatten() {
            todo.push(find(dep.as_str().unwrap_or(""))?);
        }
    }
    // Cargo writes each package as a `[[package]]` block; the text before
    // the first is the header (`version = 4`).
    let mut blocks = lock.split("\n[[package]]\n");
    let header = blocks.next().unwrap_or("");
    let blocks: Vec<&str> = blocks.collect();
    if blocks.len() != packages.len() {
        return Err("its [[package]] blocks are not in Cargo's layout".into());
    }
    let mut out = header.trim_end().to_owned();
    out.push('\n');
    for i in kept {
        out.push_str("\n[[package]]\n");
        out.push_str(blocks[i].trim_end());
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCK: &str = "# header\nversion = 4

[[package]]
name = \"a\"
version = \"1.0.0\"
dependencies = [
 \"b 2.0.0\",
]

[[package]]
name = \"b\"
version = \"1.0.0\"

[[package]]
name = \"b\"
version = \"2.0.0\"
dependencies = [
 \"c\",
]

[[package]]
name = \"c\"
version = \"0.1.0\"

[[package]]
name = \"unused\"
version = \"0.1.0\"
";

    #[test]
    fn keeps_what_the_roots_reach_and_nothing_else() {
        let out = pruned(LOCK, &["a"]).unwrap();
        let table: toml::Table = out.parse().unwrap();
        let kept: Vec<String> = table["package"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                format!(
                    "{} {}",
                    p["name"].as_str().unwrap(),
                    p["version"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(kept, ["a 1.0.0", "b 2.0.0", "c 0.1.0"]);
        assert!(out.starts_with("# header\nversion = 4\n"));
    }

    #[test]
    fn a_root_the_lock_lacks_is_an_error() {
        assert!(pruned(LOCK, &["missing"]).unwrap_err().contains("missing"));
        assert!(pruned(LOCK, &["b"]).unwrap_err().contains("several"));
    }

    #[test]
    fn the_workspace_lock_reaches_the_sdk_and_serde() {
        let out = pruned(super::super::WORKSPACE_LOCK, &["wtune-guest", "serde"]).unwrap();
        assert!(out.contains("name = \"wit-bindgen\""));
        assert!(!out.contains("name = \"wasmtime\""));
    }
}

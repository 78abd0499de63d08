//! `wtune decisions A B`: whether two experiment directories made the same
//! decisions.

use std::path::Path;

use crate::report::decisions;

use super::Failure;

/// Compares the decision records of `a` and `b`: the same (exit 0), or
/// where they part (exit 1); a directory without a readable record is the
/// user's mistake (exit 2), so a script never reads it as a difference.
pub(super) fn compare(a: &Path, b: &Path) -> Result<(), Failure> {
    let mut records = Vec::new();
    for dir in [a, b] {
        if !dir.join(decisions::DECISIONS_FILE).is_file() {
            return Err(Failure::user(format!(
                "{} holds no {}: not an experiment directory, or one written before \
                 decisions were recorded",
                dir.display(),
                decisions::DECISIONS_FILE
            )));
        }
        records.push(decisions::read(dir).map_err(Failure::user)?);
    }
    match decisions::compare((a, &records[0]), (b, &records[1])) {
        Ok(n) => {
            println!("the same {n} decisions");
            Ok(())
        }
        Err(difference) => Err(Failure::runtime(difference)),
    }
}

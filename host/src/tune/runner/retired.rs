//! Checkpoint files the runner stopped listing, deleted only once no saved
//! state lists them.
//!
//! A run in fuel order resumes from the moment its saved state marks, and
//! trusts only the checkpoints that state lists ([`crate::tune::resume`]).
//! The runner stops listing a checkpoint when `keep_checkpoints_num` drops
//! it, when a trial passes the halt a halt checkpoint carried it over, and
//! when a PBT exploit abandons a trajectory. Deleted at once, a kill before
//! the next state reaches the disk would leave a saved state that lists a
//! file that is gone, and the trial would redo its work from an older
//! checkpoint, or from scratch. So each dropped file moves aside, to
//! [`DROPPED_DIR`] in its trial's checkpoint directory, and is deleted once
//! the callbacks that save states ([`Callback::saved_through`]) have on disk
//! only states taken after the drop. A resume puts back a listed checkpoint
//! it finds there ([`crate::tune::resume`]). Moved aside, not left in
//! place, a dropped file frees its name at once: a PBT exploit's clone
//! usually takes the name of the trial's own checkpoint it replaces, and a
//! recovered trial may write the same iteration again.
//!
//! Outside fuel order a resume takes the newest intact file on disk, listed
//! or not; there a dropped file is deleted at once, since kept, an
//! exploit's abandoned trajectory could be what a resume continues.
//!
//! [`Callback::saved_through`]: super::Callback::saved_through

use std::path::{Path, PathBuf};

use crate::tune::trial::{Checkpoint, Trial};

/// Where, in a trial's checkpoint directory, dropped checkpoints wait.
pub(crate) const DROPPED_DIR: &str = ".dropped";

/// A dropped checkpoint file, waiting for the saved states to move past it.
#[derive(Debug)]
struct Dropped {
    /// Where it waits, in [`DROPPED_DIR`].
    file: PathBuf,
    /// States offered to the callbacks before the drop ([`Retired::offered`]):
    /// every state taken after it no longer lists the file.
    after: u64,
}

/// The dropped files of a run, and how many states it has offered.
#[derive(Debug, Default)]
pub(super) struct Retired {
    files: Vec<Dropped>,
    /// States offered to the callbacks so far ([`Callback::on_state`] calls).
    ///
    /// [`Callback::on_state`]: super::Callback::on_state
    offered: u64,
    /// Files dropped so far: each waits under a name of its own, as the
    /// same checkpoint name may be dropped again before the first goes.
    dropped: u64,
}

impl Retired {
    /// Drops the checkpoint `file`: deleted now, or, when `wait` (a resume
    /// trusts the saved states' listing), moved aside until no saved state
    /// lists it ([`Retired::sweep`]).
    pub(super) fn drop_file(&mut self, file: &Path, wait: bool) {
        let aside = match (wait, file.parent(), file.file_name()) {
            (true, Some(dir), Some(name)) => {
                let mut name = name.to_os_string();
                name.push(format!(".{}", self.dropped));
                dir.join(DROPPED_DIR).join(name)
            }
            _ => return delete(file),
        };
        self.dropped += 1;
        let moved = aside
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::rename(file, &aside));
        match moved {
            Ok(()) => self.files.push(Dropped {
                file: aside,
                after: self.offered,
            }),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                tracing::warn!("moving {} aside: {err}; deleting it", file.display());
                delete(file);
            }
        }
    }

    /// Stops listing `trial`'s checkpoints for which `dropped` (given each
    /// one's place in the list) says so, and drops their files
    /// ([`Retired::drop_file`]).
    pub(super) fn unlist(
        &mut self,
        trial: &mut Trial,
        wait: bool,
        mut dropped: impl FnMut(usize, &Checkpoint) -> bool,
    ) {
        let listed = std::mem::take(&mut trial.checkpoints);
        for (at, c) in listed.into_iter().enumerate() {
            if dropped(at, &c) {
                self.drop_file(&trial.dir.join(&c.path), wait);
            } else {
                trial.checkpoints.push(c);
            }
        }
    }

    /// Counts a state offered to the callbacks.
    pub(super) fn offered(&mut self) {
        self.offered += 1;
    }

    /// Deletes the dropped files that the states on disk no longer list:
    /// `saved` is how many states had been offered when the oldest of them
    /// was taken (`None`: no callback saves states, so none lists anything).
    pub(super) fn sweep(&mut self, saved: Option<u64>) {
        let saved = saved.unwrap_or(u64::MAX);
        let (gone, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.files)
            .into_iter()
            .partition(|d| d.after < saved);
        self.files = waiting;
        for d in gone {
            delete_dropped(&d.file);
        }
    }

    /// Deletes every dropped file: the state saved at the end lists none.
    pub(super) fn delete_all(&mut self) {
        for d in self.files.drain(..) {
            delete_dropped(&d.file);
        }
    }
}

/// Deletes a dropped file, and [`DROPPED_DIR`] once it is empty.
fn delete_dropped(file: &Path) {
    delete(file);
    if let Some(dir) = file.parent() {
        // Fails while other files wait there.
        let _ = std::fs::remove_dir(dir);
    }
}

fn delete(file: &Path) {
    if let Err(err) = std::fs::remove_file(file)
        && err.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("removing old checkpoint {}: {err}", file.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touched(dir: &Path, name: &str) -> PathBuf {
        let file = dir.join(name);
        std::fs::write(&file, name).unwrap();
        file
    }

    fn aside(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join(DROPPED_DIR))
            .into_iter()
            .flatten()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_file_waits_aside_for_a_saved_state_taken_after_its_drop() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (touched(dir.path(), "a"), touched(dir.path(), "b"));
        let mut retired = Retired::default();
        retired.offered(); // state 1 lists a and b
        retired.drop_file(&a, true);
        retired.offered(); // state 2 lists b only
        retired.drop_file(&b, true);
        // Both names are free at once.
        assert!(!a.exists() && !b.exists());
        assert_eq!(aside(dir.path()), ["a.0", "b.1"]);
        // The oldest state on disk is state 1: it lists both.
        retired.sweep(Some(1));
        assert_eq!(aside(dir.path()), ["a.0", "b.1"]);
        // States 2 and later are on disk: none lists a.
        retired.sweep(Some(2));
        assert_eq!(aside(dir.path()), ["b.1"]);
        retired.sweep(Some(3));
        assert!(!dir.path().join(DROPPED_DIR).exists(), "emptied, it goes");
    }

    #[test]
    fn a_name_dropped_twice_keeps_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut retired = Retired::default();
        let a = touched(dir.path(), "a");
        retired.drop_file(&a, true);
        let a = touched(dir.path(), "a");
        retired.drop_file(&a, true);
        assert_eq!(aside(dir.path()), ["a.0", "a.1"]);
        retired.delete_all();
        assert!(!dir.path().join(DROPPED_DIR).exists());
    }

    #[test]
    fn without_waiting_or_a_state_saver_files_go_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (touched(dir.path(), "a"), touched(dir.path(), "b"));
        let mut retired = Retired::default();
        retired.drop_file(&a, false);
        assert!(!a.exists());
        assert_eq!(aside(dir.path()), Vec::<String>::new());
        retired.drop_file(&b, true);
        retired.sweep(None);
        assert!(!b.exists() && !dir.path().join(DROPPED_DIR).exists());
    }
}
